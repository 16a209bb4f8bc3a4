"""Escape attempts against the code-interpreter sandbox, run through the sandbox module directly."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.agent.calls import PlannedCall, ToolCalls, execute
from service.config import Settings
from service.tools import cgroups, report_sandbox, sandbox_from_settings
from service.tools.base import ToolResult
from service.tools.code_interpreter import CodeInterpreter
from service.tools.fair_gate import FairGate
from service.tools.registry import ToolRegistry
from service.tools.sandbox import Sandbox, SandboxResult, SandboxUnavailable
from service.tools.sandbox_command import SandboxLimits

REPO = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (.ci/run installs it)")
    # The unprivileged sandbox user must be able to reach the work directories (pytest's tmp dirs are 0700).
    root = Path(tempfile.mkdtemp(prefix="sandbox-test-"))
    box = Sandbox(
        root,
        SandboxLimits(
            wall_seconds=4.0,
            cpu_seconds=2,
            memory_bytes=256 * MIB,
            output_bytes=8192,
            shm_bytes=16 * MIB,
            disk_bytes=32 * MIB,
            max_concurrent=4,
            max_per_tenant=2,
        ),
    )
    asyncio.run(box.probe())
    yield box
    for container in root.iterdir():
        box.remove(container.name)  # unmounts what the sandbox mounted
    shutil.rmtree(root, ignore_errors=True)


def run(box: Sandbox, code: str, container: str = "c1") -> SandboxResult:
    result = asyncio.run(box.run(container, code))
    # After every attempt the sandbox (and this process) still works.
    assert asyncio.run(box.run("health", "print(1 + 1)")).stdout == "2\n"
    return result


def test_probe_reports_the_layers(sandbox: Sandbox) -> None:
    described = asyncio.run(sandbox.probe())
    assert "uid 65534" in described or os.geteuid() != 0
    assert "seccomp filter on" in described


def test_runs_code_and_keeps_files_per_container(sandbox: Sandbox) -> None:
    result = run(sandbox, "open('notes.txt', 'w').write('kept'); print(sum(range(10)))")
    assert (result.stdout, result.exit_code) == ("45\n", 0)
    assert run(sandbox, "print(open('notes.txt').read())").stdout == "kept\n"
    other = run(sandbox, "import os; print(os.path.exists('notes.txt'))", container="c2")
    assert other.stdout == "False\n"


def test_no_network(sandbox: Sandbox) -> None:
    code = (
        "import socket\n"
        "for family in (socket.AF_INET, socket.AF_INET6):\n"
        "    try:\n"
        "        s = socket.socket(family, socket.SOCK_STREAM)\n"
        "        s.settimeout(1); s.connect(('127.0.0.1' if family == socket.AF_INET else '::1', 5432))\n"
        "        print('connected')\n"
        "    except OSError as exc:\n"
        "        print('blocked', exc.errno)\n"
    )
    result = run(sandbox, code)
    assert "connected" not in result.stdout
    assert result.stdout.count("blocked") == 2


def test_cannot_read_service_files_or_database(sandbox: Sandbox) -> None:
    targets = [
        str(REPO / "service" / "config.py"),
        str(REPO / "pyproject.toml"),
        "/root",
        "/work",
        "/home",
        "/opt",
        "/etc/passwd",
        "/etc/postgresql",
        "/var/lib/postgresql",
    ]
    code = (
        f"import os\nfor path in {targets!r}:\n    print(path, os.path.exists(path))\nprint(sorted(os.listdir('/')))\n"
    )
    result = run(sandbox, code)
    assert result.exit_code == 0, result.stderr
    for target in targets:
        assert f"{target} False" in result.stdout
    assert "service" not in result.stdout.splitlines()[-1]


def test_cannot_write_outside_work_dir(sandbox: Sandbox) -> None:
    code = (
        "for path in ('/usr/evil', '/etc/evil', '/evil', '/proc/sys/kernel/hostname'):\n"
        "    try:\n"
        "        open(path, 'w').write('x'); print('wrote', path)\n"
        "    except OSError as exc:\n"
        "        print('refused', path)\n"
    )
    result = run(sandbox, code)
    assert "wrote" not in result.stdout
    assert result.stdout.count("refused") == 4
    assert not Path("/usr/evil").exists() and not Path("/etc/evil").exists()


def test_namespace_calls_denied(sandbox: Sandbox) -> None:
    code = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('unshare', libc.unshare(0x10000000), ctypes.get_errno())\n"
    )
    result = run(sandbox, code)
    assert result.stdout.startswith("unshare -1 1"), result.stdout + result.stderr


def test_fork_bomb_is_cut(sandbox: Sandbox) -> None:
    code = (
        "import os\n"
        "children = 0\n"
        "for _ in range(500):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        import time; time.sleep(30); os._exit(0)\n"
        "    children += 1\n"
        "print('children', children)\n"
    )
    result = run(sandbox, code)
    # Capped by the process limit (or killed by the wall clock), never 500 children.
    assert result.timed_out or int(result.stdout.split()[-1]) < 500


def test_memory_hog_is_cut(sandbox: Sandbox) -> None:
    result = run(sandbox, "x = bytearray(2 * 1024 ** 3)\nprint('allocated')")
    assert "allocated" not in result.stdout
    assert "MemoryError" in result.stderr


def test_endless_loop_is_killed(sandbox: Sandbox) -> None:
    result = run(sandbox, "while True:\n    pass\n")
    assert result.exit_code != 0
    assert "42" not in result.stdout


def test_endless_sleep_hits_the_wall_clock(sandbox: Sandbox) -> None:
    result = run(sandbox, "import time\ntime.sleep(60)\n")
    assert result.timed_out
    assert "wall-clock" in result.logs


def test_huge_output_is_cut(sandbox: Sandbox) -> None:
    result = run(sandbox, "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n")
    assert result.output_truncated
    assert len(result.stdout) + len(result.stderr) <= 8192


def test_bad_container_id_refused(sandbox: Sandbox) -> None:
    with pytest.raises(ValueError):
        asyncio.run(sandbox.run("../escape", "print(1)"))


def test_code_interpreter_call_runs_once_through_the_agent_loop(sandbox: Sandbox) -> None:
    """The interpreter behind the agent loop: a replayed log reuses the logged result, never re-runs the code."""
    interpreter = CodeInterpreter(sandbox, "loop")
    registry = ToolRegistry()
    registry.add("python", interpreter)
    log: list[tuple[str, dict[str, Any]]] = []

    async def log_fact(kind: str, data: dict[str, Any]) -> None:
        log.append((kind, json.loads(json.dumps(data))))  # what the log would give back

    code = "open('runs.txt', 'a').write('x'); print(len(open('runs.txt').read()))"
    call = PlannedCall(0, "python", "python", code)

    async def once() -> ToolResult:
        calls = ToolCalls.from_facts("resp_ci", max_calls=4, facts=log)
        return await execute(calls, call, registry, log_fact, timeout_seconds=30)

    first = asyncio.run(once())
    assert first.output == "1\n" and first.details == {"exit_code": 0, "timed_out": False}
    assert asyncio.run(once()) == first
    assert [kind for kind, _ in log] == ["tool_call_started", "tool_call_result"]
    assert (sandbox.root / "loop" / "runs.txt").read_text() == "x"


def test_start_up_report(sandbox: Sandbox, tmp_path: Path) -> None:
    settings = Settings(sandbox_dir=sandbox.root / "report")
    assert asyncio.run(report_sandbox(settings)) is None
    broken = Sandbox(sandbox.root, python=str(tmp_path / "no-python"))
    with pytest.raises(SandboxUnavailable, match="no-python is missing"):
        asyncio.run(broken.probe())


def test_remove_deletes_a_container_and_is_idempotent(sandbox: Sandbox) -> None:
    code = "import os; os.makedirs('d/e'); open('d/e/f', 'w').write('x'); os.symlink('/etc', 'l')"
    assert run(sandbox, code, container="gone").exit_code == 0
    assert (sandbox.root / "gone").is_dir()
    sandbox.remove("gone")
    assert not (sandbox.root / "gone").exists()
    assert Path("/etc/passwd").exists()
    sandbox.remove("gone")  # again: nothing to do
    with pytest.raises(ValueError):
        sandbox.remove("../escape")
    with pytest.raises(ValueError):
        sandbox.remove("")


SECRETS = {
    "SERVICE_SECRET_KEY": "secret-key-d41d8cd98f",
    "SERVICE_API_KEY": "api-key-0cc175b9c0f1",
    "SERVICE_DATABASE_URL": "postgresql://user:db-password-92eb5ffee6@host/db",
}


def test_no_service_environment_inside(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    """bwrap is pid 1 inside, as the same uid: its environment and command line must not carry the service's."""
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    code = (
        "import os\n"
        "seen = []\n"
        "for pid in os.listdir('/proc'):\n"
        "    if not pid.isdigit() and pid != 'self':\n"
        "        continue\n"
        "    for name in ('environ', 'cmdline'):\n"
        "        try:\n"
        "            seen.append(open(f'/proc/{pid}/{name}', 'rb').read().decode(errors='replace'))\n"
        "        except OSError as exc:\n"
        "            seen.append(f'unreadable {pid}/{name}')\n"
        "    for fd in os.listdir(f'/proc/{pid}/fd') if os.access(f'/proc/{pid}/fd', os.R_OK) else ():\n"
        "        try:\n"
        "            seen.append(f'fd {pid}/{fd} ' + os.readlink(f'/proc/{pid}/fd/{fd}'))\n"
        "        except OSError:\n"
        "            pass  # the directory listing's own descriptor, closed by now\n"
        "print(repr(os.environ))\n"
        "print('\\n'.join(seen))\n"
    )
    result = run(sandbox, code)
    assert result.exit_code == 0, result.stderr
    assert "/proc/1/environ" not in result.stdout and "PATH=/usr/bin:/bin" in result.stdout
    for name, value in SECRETS.items():
        assert value not in result.stdout, name
        assert name not in result.stdout, name
    assert str(REPO) not in result.stdout  # not even the service's working directory
    fds = [line for line in result.stdout.splitlines() if line.startswith("fd ")]
    # Only the three pipes, and bwrap's own eventfd in pid 1: no descriptor of the service's.
    assert fds and all(line.split()[2].startswith(("pipe:", "anon_inode:[eventfd]")) for line in fds), fds


def test_memory_limit_is_per_execution(sandbox: Sandbox) -> None:
    """Eight processes of 48 MiB each (all under the per-process cap): together they stay under 256 MiB."""
    if not sandbox.cgroups.memory:
        pytest.skip("no usable memory cgroup here (the sandbox falls back to RLIMIT_AS per process)")
    code = (
        "import os, select, time\n"
        "r, w = os.pipe()\n"
        "kids = []\n"
        "for _ in range(8):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        block = b'\\1' * (48 << 20)\n"
        "        os.write(w, b'%08d' % os.getpid())\n"
        "        time.sleep(30)\n"
        "        os._exit(0)\n"
        "    kids.append(pid)\n"
        "os.close(w)\n"
        "ready, gone, pending, deadline = set(), set(), b'', time.time() + 20\n"
        "while len(ready | gone) < 8 and time.time() < deadline:\n"  # each child has its block or is gone
        "    if select.select([r], [], [], 0.05)[0]:\n"
        "        pending += os.read(r, 64)\n"
        "        while len(pending) >= 8:\n"
        "            ready.add(int(pending[:8]))\n"
        "            pending = pending[8:]\n"
        "    gone |= {pid for pid in kids if pid not in gone and os.waitpid(pid, os.WNOHANG) != (0, 0)}\n"
        "time.sleep(0.5)\n"
        "alive = sum(1 for pid in kids if pid not in gone and os.waitpid(pid, os.WNOHANG) == (0, 0))\n"
        "print('held', alive * 48, flush=True)\n"
    )
    result = run(sandbox, code)
    held = [int(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("held")]
    # Either the out-of-memory killer took children (the parent reports what is left) or the parent itself.
    assert held == [] or held[0] < 256, result.stdout + result.stderr


def _fill(directory: str, chunk_mib: int, total_mib: int, pause: float = 0.0) -> str:
    """Code that writes files of `chunk_mib` until `total_mib` or an error; prints the MiB written."""
    return (
        "import os, time\n"
        "written = 0\n"
        f"for i in range({total_mib // chunk_mib}):\n"
        "    try:\n"
        f"        with open(os.path.join({directory!r}, f'f{{i}}'), 'wb') as f:\n"
        f"            f.write(b'x' * ({chunk_mib} << 20))\n"
        "    except OSError as exc:\n"
        "        print('refused', exc.errno)\n"
        "        break\n"
        f"    written += {chunk_mib}\n"
        f"    time.sleep({pause})\n"
        "print('written', written)\n"
    )


def _written(result: SandboxResult) -> int:
    return int(result.stdout.split()[-1])


def test_dev_shm_is_capped(sandbox: Sandbox) -> None:
    result = run(sandbox, _fill("/dev/shm", 4, 64))
    assert "refused" in result.stdout, result.stdout + result.stderr
    assert _written(result) <= 16


def test_work_dir_bytes_are_capped_per_container(sandbox: Sandbox) -> None:
    if os.geteuid() != 0:
        pytest.skip("the kernel-capped work directory (a tmpfs mount) needs root; see the measured fallback's test")
    result = run(sandbox, _fill(".", 4, 96), container="full")
    assert "refused" in result.stdout, result.stdout + result.stderr
    assert _written(result) <= 32
    assert sum(f.stat().st_size for f in (sandbox.root / "full").iterdir()) <= 32 * MIB
    # The container still works: its code may delete files and write again.
    again = run(sandbox, "import os\nfor f in os.listdir('.'): os.remove(f)\n" + _fill(".", 4, 8), container="full")
    assert _written(again) == 8


def test_unmounted_work_dir_is_measured_while_code_runs(sandbox: Sandbox) -> None:
    """A directory the sandbox could not mount (not root, or older files in it) is measured: the run is killed
    or, when it wrote faster than the walks, its newest files are removed until the directory fits again."""
    legacy = sandbox.root / "legacy"
    legacy.mkdir(mode=0o700)
    (legacy / "old.txt").write_text("kept from before")
    if os.geteuid() == 0:
        os.chown(legacy, 65534, 65534)
    slow = run(sandbox, _fill(".", 1, 200, pause=0.01), container="legacy")
    assert not os.path.ismount(legacy)
    assert slow.disk_full and "work directory over its size limit" in slow.logs
    assert "written" not in slow.stdout
    fast = run(sandbox, _fill(".", 8, 96), container="legacy")  # may finish before the first walk
    assert fast.disk_full
    assert sum(f.stat().st_size for f in legacy.iterdir()) <= 32 * MIB
    assert (legacy / "old.txt").read_text() == "kept from before"


def test_one_tenant_holding_processes_does_not_break_another(sandbox: Sandbox) -> None:
    hold = (
        "import os, time\n"
        "n = 0\n"
        "for _ in range(40):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(30); os._exit(0)\n"
        "    n += 1\n"
        "print('children', n, flush=True)\n"
        "time.sleep(2.5)\n"
    )

    async def both() -> tuple[SandboxResult, list[SandboxResult]]:
        holder = asyncio.ensure_future(sandbox.run("tenant-a", hold, tenant="a"))
        await asyncio.sleep(1.0)
        others = await asyncio.gather(*(sandbox.run(f"tenant-b{i}", "print(6 * 7)", tenant=f"b{i}") for i in range(2)))
        return await holder, list(others)

    holder, others = asyncio.run(both())
    assert "children" in holder.stdout, holder.stderr
    for other in others:
        assert (other.stdout, other.exit_code) == ("42\n", 0), other.stderr


def test_executions_queue_per_tenant(sandbox: Sandbox) -> None:
    """Two at once per tenant (the fixture's limit): a third waits, and another tenant does not wait behind it."""
    code = "import time\nstart = time.time()\ntime.sleep(0.8)\nprint(start, time.time())\n"

    async def spans() -> list[tuple[float, float]]:
        runs = [sandbox.run(f"q{i}", code, tenant="busy") for i in range(3)]
        runs.append(sandbox.run("q-other", code, tenant="other"))
        results = await asyncio.gather(*runs)
        assert all(r.exit_code == 0 for r in results), [r.stderr for r in results]
        return [(float(r.stdout.split()[0]), float(r.stdout.split()[1])) for r in results]

    busy_a, busy_b, busy_c, other = asyncio.run(spans())
    first_two_end = min(busy_a[1], busy_b[1])
    assert busy_c[0] >= first_two_end - 0.05  # the third of one tenant waited for one of its first two
    assert other[0] < first_two_end  # the other tenant ran alongside, not queued behind


def test_settings_reach_the_limits() -> None:
    settings = Settings(
        sandbox_disk_bytes=3 * MIB,
        sandbox_disk_files=99,
        sandbox_shm_bytes=5 * MIB,
        sandbox_tmp_bytes=6 * MIB,
        sandbox_max_concurrent=7,
        sandbox_max_per_project=3,
    )
    lim = sandbox_from_settings(settings).limits
    assert (lim.disk_bytes, lim.disk_files, lim.shm_bytes, lim.tmp_bytes) == (3 * MIB, 99, 5 * MIB, 6 * MIB)
    assert (lim.max_concurrent, lim.max_per_tenant) == (7, 3)


def test_fair_gate_serves_the_tenant_holding_least_first() -> None:
    """Tenant a queues five, b queues one after them: b's goes next, before a's queued ones."""
    order: list[str] = []

    async def scenario() -> None:
        gate = FairGate(total=2, per_tenant=2)

        async def job(tenant: str, hold: asyncio.Event) -> None:
            async with gate.slot(tenant):
                order.append(tenant)
                await hold.wait()

        release = asyncio.Event()
        tasks = [asyncio.ensure_future(job("a", release)) for _ in range(5)]
        await asyncio.sleep(0)
        tasks.append(asyncio.ensure_future(job("b", release)))
        await asyncio.sleep(0)
        assert order == ["a", "a"] and gate.waiting == 4
        waiting = asyncio.ensure_future(job("c", asyncio.Event()))
        await asyncio.sleep(0)
        waiting.cancel()  # a waiter that gives up leaves no trace
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        release.set()
        await asyncio.gather(*tasks)
        assert not gate.held and gate.waiting == 0

    asyncio.run(scenario())
    assert order == ["a", "a", "b", "a", "a", "a"], order


def test_probe_names_the_fallbacks_without_cgroups(sandbox: Sandbox) -> None:
    """Where no cgroup is usable the sandbox still runs, and says which limits became weaker."""
    box = Sandbox(sandbox.root, sandbox.limits)
    box._cgroups = cgroups.Cgroups([])
    described = asyncio.run(box.probe())
    assert "per process only (RLIMIT_AS" in described
    assert "shared by all executions" in described
    assert "per execution" not in described
    assert "cgroup v1" in sandbox.describe_limits(True) or "cgroup v2" in sandbox.describe_limits(True)


def test_a_program_that_never_reads_its_code_fails_the_probe_without_raising_elsewhere(sandbox: Sandbox) -> None:
    """A sandboxed process that ends before reading its program (its stdin closed under the writer, which
    uvloop reports as a RuntimeError) is a failed run, and a probe that fails every time says why: the server
    starts without the code interpreter instead of dying in its lifespan."""
    import uvloop

    box = Sandbox(sandbox.root, sandbox.limits, python="/usr/bin/true")

    async def probe() -> str:
        return await box.probe()

    with pytest.raises(SandboxUnavailable, match=r"sandbox probe failed \(exit 0\)"):
        uvloop.run(probe())


def test_a_probe_that_fails_once_is_tried_again(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    box = Sandbox(sandbox.root, sandbox.limits)
    real_run, calls = Sandbox.run, []

    async def flaky(self: Sandbox, container_id: str, code: str, *, tenant: str = "default") -> SandboxResult:
        calls.append(container_id)
        if len(calls) == 1:
            return SandboxResult(stdout="", stderr="fork: Resource temporarily unavailable", exit_code=1)
        return await real_run(self, container_id, code, tenant=tenant)

    monkeypatch.setattr(Sandbox, "run", flaky)
    assert "bubblewrap sandbox" in asyncio.run(box.probe())
    assert len(calls) == 2 and calls[0] != calls[1]
