"""The sandbox's command line: the chain `sh` (joining the execution's cgroups), `setpriv`, `prlimit`, `bwrap`, and
the prelude the sandboxed interpreter runs first (the seccomp filter), built from a SandboxLimits. What each layer
does and why is told in service/tools/sandbox.py, which runs the command."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

NOBODY = 65534
_NPROC_SLACK = 16  # other processes of the sandbox uid, and the chain's own before the cgroup counts them
# Writes its own pid into each cgroup.procs named after the count in $1, then execs the remaining arguments.
_JOIN = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n - 1)); done; exec "$@"'

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
    memory_bytes: int = 512 * 1024 * 1024  # per execution (cgroup) and per process (RLIMIT_AS)
    file_bytes: int = 16 * 1024 * 1024
    tmp_bytes: int = 64 * 1024 * 1024
    shm_bytes: int = 64 * 1024 * 1024
    disk_bytes: int = 128 * 1024 * 1024  # one container's work directory, all files together
    disk_files: int = 16384  # one container's work directory: files and directories
    open_files: int = 64
    processes: int = 32  # per execution (cgroup pids.max)
    output_bytes: int = 64 * 1024
    max_concurrent: int = 8  # executions at once, all tenants
    max_per_tenant: int = 2  # executions at once, one tenant


def sandbox_command(
    limits: SandboxLimits, python: str, workdir: Path, cgroup_dirs: list[Path] | None = None
) -> list[str]:
    """The argv that runs `python` on the prelude in the sandbox, `workdir` at /mnt/data: the chain of layers
    (service/tools/sandbox.py's docstring), each limit from `limits`."""
    lim = limits
    bwrap = shutil.which("bwrap") or "bwrap"
    argv: list[str] = []
    if cgroup_dirs:
        # Joins this execution's cgroups, then becomes the rest of the chain: nothing runs outside them.
        argv += ["/bin/sh", "-c", _JOIN, "sh", str(len(cgroup_dirs))]
        argv += [str(d / "cgroup.procs") for d in cgroup_dirs]
    if os.geteuid() == 0:
        argv += [shutil.which("setpriv") or "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    argv += [
        shutil.which("prlimit") or "prlimit",
        f"--as={lim.memory_bytes}",
        f"--cpu={lim.cpu_seconds}",
        f"--fsize={lim.file_bytes}",
        f"--nofile={lim.open_files}",
        f"--nproc={uid_processes(lim)}",
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
        "--size", str(lim.shm_bytes), "--tmpfs", "/dev/shm",
        "--size", str(lim.tmp_bytes), "--tmpfs", "/tmp",
        "--bind", str(workdir), "/mnt/data",
        "--remount-ro", "/",
        "--chdir", "/mnt/data",
        "--clearenv",
        "--setenv", "PATH", "/usr/bin:/bin",
        "--setenv", "HOME", "/mnt/data",
        "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
        "--",
        python, "-I", "-c", _PRELUDE,
    ]  # fmt: skip
    return argv


def uid_processes(limits: SandboxLimits) -> int:
    """RLIMIT_NPROC: counted per uid, so shared by every execution running at once; sized for all of them."""
    return limits.processes * limits.max_concurrent + _NPROC_SLACK
