"""Escape attempts against the code-interpreter sandbox, run through the sandbox module directly."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.agent_loop import PlannedCall, ToolCalls, execute
from service.config import Settings
from service.tools import report_sandbox
from service.tools.base import ToolResult
from service.tools.code_interpreter import CodeInterpreter
from service.tools.registry import ToolRegistry
from service.tools.sandbox import Sandbox, SandboxLimits, SandboxResult, SandboxUnavailable

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (.ci/run installs it)")
    # The unprivileged sandbox user must be able to reach the work directories (pytest's tmp dirs are 0700).
    root = Path(tempfile.mkdtemp(prefix="sandbox-test-"))
    box = Sandbox(
        root,
        SandboxLimits(wall_seconds=4.0, cpu_seconds=2, memory_bytes=256 * 1024 * 1024, output_bytes=8192),
    )
    asyncio.run(box.probe())
    yield box
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
