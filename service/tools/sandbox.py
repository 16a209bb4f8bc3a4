"""Run untrusted Python in a sandbox: bubblewrap namespaces, rlimits, an unprivileged uid, seccomp, a wall clock.

Layers, outermost first:
- `setpriv` drops to uid/gid 65534 when the service runs as root (process limits do nothing for root);
- `prlimit` caps address space, CPU seconds, file size, open files and processes;
- `bwrap --unshare-all` gives the code no network (only its own loopback), its own pid/ipc/uts namespaces,
  a read-only view of `/usr` and three loader files of `/etc` only (not the service's files, not its
  database), a size-capped tmpfs `/tmp` and one writable work directory per container;
- a seccomp filter loaded by the first lines the sandboxed interpreter runs (Debian's `python3-seccomp`),
  before the model's code: sockets other than Unix sockets, namespace calls, mount, ptrace, bpf and keyring
  calls fail with EPERM; `clone3` reports ENOSYS so libc falls back to `clone`, whose namespace flags are denied;
- a wall-clock kill, and output cut at a byte limit (the process is killed once it writes past it).

Nothing here knows about HTTP or the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

NOBODY = 65534
_CONTAINER_ID = re.compile(r"^[A-Za-z0-9_\-]{1,64}$")

# Runs first inside the sandbox: load the seccomp filter, then execute the model's code read from stdin.
_PRELUDE = r"""
import sys
_code = sys.stdin.read()
sys.stdin.close()
try:
    import seccomp as _s
except ImportError:
    _s = None
if _s is not None:
    import errno as _e, socket as _so
    _f = _s.SyscallFilter(defaction=_s.ALLOW)
    _f.add_rule(_s.ERRNO(_e.EPERM), "socket", _s.Arg(0, _s.NE, _so.AF_UNIX))
    _f.add_rule(_s.ERRNO(_e.EPERM), "socketpair", _s.Arg(0, _s.NE, _so.AF_UNIX))
    for _name in ("unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "ptrace", "bpf", "keyctl",
                  "add_key", "request_key", "perf_event_open", "userfaultfd", "init_module", "finit_module",
                  "kexec_load", "reboot", "swapon", "swapoff", "mount_setattr", "open_tree", "move_mount", "fsopen"):
        try:
            _f.add_rule(_s.ERRNO(_e.EPERM), _name)
        except Exception:
            pass
    _f.add_rule(_s.ERRNO(_e.ENOSYS), "clone3")
    for _flag in (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000):
        _f.add_rule(_s.ERRNO(_e.EPERM), "clone", _s.Arg(0, _s.MASKED_EQ, _flag, _flag))
    _f.load()
    del _f, _s, _e, _so
globals().pop("_name", None)
globals().pop("_flag", None)
exec(compile(_code, "<code>", "exec"), {"__name__": "__main__"})
"""


@dataclass(frozen=True)
class SandboxLimits:
    wall_seconds: float = 10.0
    cpu_seconds: int = 5
    memory_bytes: int = 512 * 1024 * 1024
    file_bytes: int = 16 * 1024 * 1024
    tmp_bytes: int = 64 * 1024 * 1024
    open_files: int = 64
    processes: int = 32
    output_bytes: int = 64 * 1024


@dataclass(frozen=True)
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool = False
    output_truncated: bool = False

    @property
    def logs(self) -> str:
        """What a code_interpreter_call shows as its `logs` output."""
        text = self.stdout + self.stderr
        if self.timed_out:
            text += "\n[killed: wall-clock limit]"
        if self.output_truncated:
            text += "\n[output truncated]"
        return text


class SandboxUnavailable(RuntimeError):
    """This machine cannot run the sandbox (missing bubblewrap, python3, or user namespaces)."""


@dataclass
class Sandbox:
    """Launches one sandboxed `python3` per call, in a work directory kept per container id."""

    root: Path
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    python: str = "/usr/bin/python3"

    def command(self, workdir: Path) -> list[str]:
        lim = self.limits
        bwrap = shutil.which("bwrap") or "bwrap"
        argv: list[str] = []
        if os.geteuid() == 0:
            argv += [shutil.which("setpriv") or "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        argv += [
            shutil.which("prlimit") or "prlimit",
            f"--as={lim.memory_bytes}",
            f"--cpu={lim.cpu_seconds}",
            f"--fsize={lim.file_bytes}",
            f"--nofile={lim.open_files}",
            f"--nproc={lim.processes}",
            "--core=0",
            "--",
            bwrap,
            "--unshare-all",
            "--unshare-user",
            "--die-with-parent",
            "--new-session",
            "--disable-userns",
            "--ro-bind", "/usr", "/usr",
            # From /etc only what the dynamic loader and Python read: no service config, no credentials.
            "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache",
            "--ro-bind-try", "/etc/localtime", "/etc/localtime",
            "--ro-bind-try", "/etc/nsswitch.conf", "/etc/nsswitch.conf",
            "--symlink", "usr/bin", "/bin",
            "--symlink", "usr/lib", "/lib",
            "--symlink", "usr/lib64", "/lib64",
            "--symlink", "usr/sbin", "/sbin",
            "--proc", "/proc",
            "--dev", "/dev",
            "--size", str(lim.tmp_bytes), "--tmpfs", "/tmp",
            "--bind", str(workdir), "/mnt/data",
            "--remount-ro", "/",
            "--chdir", "/mnt/data",
            "--clearenv",
            "--setenv", "PATH", "/usr/bin:/bin",
            "--setenv", "HOME", "/mnt/data",
            "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
            "--",
            self.python, "-I", "-c", _PRELUDE,
        ]  # fmt: skip
        return argv

    def workdir(self, container_id: str) -> Path:
        if not _CONTAINER_ID.match(container_id):
            raise ValueError(f"bad container id {container_id!r}")
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o711)  # the sandbox user may enter its own directory, not list the others
        path = self.root / container_id
        path.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            os.chown(path, NOBODY, NOBODY)
        path.chmod(0o700)
        return path

    def remove(self, container_id: str) -> None:
        """Delete a container's work directory (idempotent); refuses ids that are not plain names."""
        if not _CONTAINER_ID.match(container_id):
            raise ValueError(f"bad container id {container_id!r}")
        path = self.root / container_id
        if path.is_symlink():  # never follow a link out of the root
            path.unlink()
            return
        if not path.exists():
            return
        _unmount(path)
        # rmtree walks by file descriptor without following links the sandboxed code may have left inside.
        shutil.rmtree(path, ignore_errors=True)

    async def run(self, container_id: str, code: str, *, tenant: str = "default") -> SandboxResult:
        workdir = self.workdir(container_id)
        proc = await asyncio.create_subprocess_exec(
            *self.command(workdir),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        budget = [self.limits.output_bytes]
        truncated = asyncio.Event()

        async def feed() -> None:
            assert proc.stdin is not None
            try:
                proc.stdin.write(code.encode("utf-8", "surrogatepass"))
                await proc.stdin.drain()
                proc.stdin.close()
            except (BrokenPipeError, ConnectionResetError):
                pass

        async def drain(stream: asyncio.StreamReader, sink: bytearray) -> None:
            while chunk := await stream.read(65536):
                take = min(len(chunk), budget[0])
                sink += chunk[:take]
                budget[0] -= take
                if take < len(chunk) and not truncated.is_set():
                    truncated.set()
                    _kill(proc.pid)  # then read on to the end of the pipe, discarding

        out, err = bytearray(), bytearray()
        timed_out = False
        work = asyncio.gather(feed(), drain(proc.stdout, out), drain(proc.stderr, err), proc.wait())
        try:
            await asyncio.wait_for(asyncio.shield(work), timeout=self.limits.wall_seconds)
        except TimeoutError:
            timed_out = True
            _kill(proc.pid)
        finally:
            if proc.returncode is None:
                _kill(proc.pid)
            await asyncio.wait_for(proc.wait(), timeout=5)
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await work
        return SandboxResult(
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            exit_code=proc.returncode,
            timed_out=timed_out,
            output_truncated=truncated.is_set(),
        )

    async def probe(self) -> str:
        """Run a trivial program in the sandbox; return what protects it, or raise SandboxUnavailable."""
        for tool in ("bwrap", "prlimit") + (("setpriv",) if os.geteuid() == 0 else ()):
            if shutil.which(tool) is None:
                raise SandboxUnavailable(f"'{tool}' is not installed (Debian: bubblewrap, util-linux)")
        if not Path(self.python).exists():
            raise SandboxUnavailable(f"{self.python} is missing")
        code = "import os\nprint(6 * 7, os.getuid(), 'Seccomp:\\t2' in open('/proc/self/status').read())"
        try:
            result = await self.run("probe", code)
        except OSError as exc:
            raise SandboxUnavailable(f"cannot start the sandbox: {exc}") from exc
        fields = result.stdout.split()
        if not fields or fields[0] != "42":
            raise SandboxUnavailable(f"sandbox probe failed: {(result.stderr or result.stdout).strip()[-300:]}")
        seccomp = "seccomp filter on" if fields[2:] == ["True"] else "NO seccomp filter (install python3-seccomp)"
        return f"bubblewrap sandbox with {self.python}, uid {fields[1]}, {seccomp}"


def _unmount(path: Path) -> None:
    """Unmount whatever this module mounted on a work directory (nothing when not mounted)."""
    if os.path.ismount(path):
        umount = shutil.which("umount") or "umount"
        subprocess.run([umount, "-l", str(path)], check=False, capture_output=True)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
