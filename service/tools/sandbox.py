"""Run untrusted Python in a sandbox: bubblewrap namespaces, per-execution cgroups, rlimits, seccomp, a wall clock.

Layers, outermost first:
- the whole chain (`sh` joining the cgroups, `setpriv`, `prlimit`, `bwrap`) starts with the environment
  `PATH=/usr/bin:/bin` only, working directory `/`, and no inherited descriptor but its three pipes: `bwrap`
  is pid 1 inside the sandbox as the same uid, so its `/proc/1/environ` and `/proc/1/cmdline` are readable by
  the code; they hold no service variable (keys, database URL). `--clearenv` then sets the code's own
  (`PATH`, `HOME=/mnt/data`, `PYTHONDONTWRITEBYTECODE`);
- a per-execution control group (service/tools/cgroups.py), made before and removed after each run, joined by a
  `/bin/sh` wrapper that writes its own pid into each `cgroup.procs` and then execs the rest of the chain, so no
  sandboxed process ever runs outside it. At the end every process left in it is SIGKILLed and it is removed.
  Detected once per process: cgroup v2 (the service's own cgroup, when `memory` and `pids` are or can be enabled
  in its `cgroup.subtree_control`, e.g. a systemd `Delegate=yes` unit), else the cgroup v1 `memory` and `pids`
  hierarchies (each on its own, a child of the service's own cgroup there). It caps:
  - memory: `memory.max` (v2, with `memory.swap.max=0` and `memory.oom.group=1`: an out-of-memory kill takes
    the whole execution) or `memory.limit_in_bytes` and `memory.memsw.limit_in_bytes` (v1: the kernel's OOM
    killer kills the largest process of the execution) = `memory_bytes` for ALL the execution's processes
    together, including the pages it writes to its tmpfs `/tmp` and `/dev/shm` and to its work-dir tmpfs;
  - processes: `pids.max` = `processes` for the execution (bwrap's two processes included); forks beyond fail
    with EAGAIN inside that execution only;
- `setpriv` drops to uid/gid 65534 when the service runs as root (process limits do nothing for root);
- `prlimit` caps each process: address space (`memory_bytes`, RLIMIT_AS), CPU seconds, file size (`file_bytes`),
  open files, no core files, and RLIMIT_NPROC. RLIMIT_NPROC counts every process of the uid, i.e. of every
  execution running at once, so it is set to `processes * max_concurrent + 16`: never reached while the pids
  cgroup bounds each execution and the gate bounds how many run (an execution holding its processes cannot make
  another's `bwrap` fail with "Creating new namespace failed");
- `bwrap --unshare-all` gives the code no network (only its own loopback), its own pid/ipc/uts/cgroup
  namespaces, a read-only view of `/usr` and three loader files of `/etc` only (not the service's files, not its
  database), a tmpfs `/tmp` of `tmp_bytes`, a tmpfs `/dev/shm` of `shm_bytes` (over bwrap's `--dev` one, which
  has no cap), and one writable work directory per container at `/mnt/data`;
- the work directory's size, per container (all its files together, across executions):
  - running as root: a tmpfs of `disk_bytes` with `nr_inodes=disk_files`, mode 0700, owner 65534, `nosuid,nodev`,
    mounted on the empty container directory on the host by `workdir()`; writes past it fail with ENOSPC. The
    files live in memory (swappable), so the host holds up to `disk_bytes` per live container; the mount
    outlives the service process (a restart keeps the files) until `remove()` unmounts it (lazily) and deletes
    the directory. A container directory that already holds files and is not a mount (made before this
    mechanism) is left as it is and falls under the measured cap below;
  - otherwise (not root, or the mount failed): measured. The bound is `disk_bytes`, or the directory's size when
    the run began if that was larger. While code runs, the directory is walked every 0.1 s (`st_blocks`, links
    not followed) and the execution is killed once it is over the bound; after the run, if it is still over
    (written between two walks, or faster than the first), the regular files modified during the run are
    deleted, newest first, until it fits (by directory descriptor, links never followed). Either way the
    result says `[killed: work directory over its size limit]`. Weaker than the tmpfs: while the run lasts the
    directory may exceed the cap by what can be written in 0.1 s (disk speed; `file_bytes` per file), and the
    host filesystem's free space is what is shared;
- fairness: `run(..., tenant=...)` waits for a place in a gate of `max_concurrent` executions at once and
  `max_per_tenant` per tenant (the project). Waiters queue instead of failing; a freed place goes to the waiter
  whose tenant holds the fewest places, the earliest among equals (service/tools/fair_gate.py). The wall clock
  starts once the execution starts;
- a seccomp filter loaded by the first lines the sandboxed interpreter runs (Debian's `python3-seccomp`),
  before the model's code: sockets other than Unix sockets, namespace calls, mount, ptrace, bpf and keyring
  calls fail with EPERM; `clone3` reports ENOSYS so libc falls back to `clone`, whose namespace flags are denied;
- a wall-clock kill, and output cut at a byte limit (the process is killed once it writes past it).

Fallbacks, reported by `probe()`: no usable memory cgroup -> memory is capped per process only (RLIMIT_AS), so
an execution may hold `processes x memory_bytes`; no usable pids cgroup -> RLIMIT_NPROC is the only process cap,
shared by all executions (one execution may use all `processes * max_concurrent + 16` and make the others'
forks and namespace creation fail).

Nothing here knows about HTTP or the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from service.tools import cgroups
from service.tools.fair_gate import FairGate
from service.tools.sandbox_command import NOBODY, SandboxLimits, sandbox_command, uid_processes

_ENV = {"PATH": "/usr/bin:/bin"}  # all the chain (sh, setpriv, prlimit, bwrap) is given; bwrap clears it for the code
_DISK_POLL_SECONDS = 0.1
log = logging.getLogger(__name__)
_probes = itertools.count()
# Tries of the start-up probe, 0.5 s, 1 s, 2 s, 4 s apart: RLIMIT_NPROC counts every process of the sandbox uid on
# the machine, so another server's execution at its process limit (a fork bomb) can refuse this probe's fork for
# a few seconds.
_PROBE_ATTEMPTS = 5
_CONTAINER_ID = re.compile(r"^[A-Za-z0-9_\-]{1,64}$")


@dataclass(frozen=True)
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool = False
    output_truncated: bool = False
    disk_full: bool = False

    @property
    def logs(self) -> str:
        """What a code_interpreter_call shows as its `logs` output."""
        text = self.stdout + self.stderr
        if self.timed_out:
            text += "\n[killed: wall-clock limit]"
        if self.output_truncated:
            text += "\n[output truncated]"
        if self.disk_full:
            text += "\n[killed: work directory over its size limit]"
        return text


class SandboxUnavailable(RuntimeError):
    """This machine cannot run the sandbox (missing bubblewrap, python3, or user namespaces)."""


@dataclass
class Sandbox:
    """Launches one sandboxed `python3` per call, in a work directory kept per container id."""

    root: Path
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    python: str = "/usr/bin/python3"
    _gate: FairGate | None = field(default=None, init=False, repr=False)
    _cgroups: cgroups.Cgroups | None = field(default=None, init=False, repr=False)

    @property
    def gate(self) -> FairGate:
        if self._gate is None:
            self._gate = FairGate(self.limits.max_concurrent, self.limits.max_per_tenant)
        return self._gate

    @property
    def cgroups(self) -> cgroups.Cgroups:
        if self._cgroups is None:
            self._cgroups = cgroups.detect()
        return self._cgroups

    def workdir(self, container_id: str) -> Path:
        if not _CONTAINER_ID.match(container_id):
            raise ValueError(f"bad container id {container_id!r}")
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o711)  # the sandbox user may enter its own directory, not list the others
        path = self.root / container_id
        path.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            self._mount_tmpfs(path)
            os.chown(path, NOBODY, NOBODY)
        path.chmod(0o700)
        return path

    def _mount_tmpfs(self, path: Path) -> None:
        """As root: a size-capped tmpfs on an empty work directory, so the kernel caps the container's bytes."""
        if os.path.ismount(path) or any(path.iterdir()):
            return  # already ours, or older files kept on disk (then measured while code runs)
        lim = self.limits
        options = f"size={lim.disk_bytes},nr_inodes={lim.disk_files},mode=0700,uid={NOBODY},gid={NOBODY}"
        mount = shutil.which("mount") or "mount"
        subprocess.run(
            [mount, "-t", "tmpfs", "-o", f"nosuid,nodev,{options}", "sandbox-data", str(path)],
            check=False,
            capture_output=True,
            env=_ENV,
        )

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
        """Run `code` in the container's directory; waits (fairly across tenants) for a free execution slot."""
        workdir = self.workdir(container_id)
        async with self.gate.slot(tenant):
            groups = self.cgroups
            dirs = groups.create(self.limits.memory_bytes, self.limits.processes) if groups.controllers else []
            try:
                return await self._run(workdir, code, dirs)
            finally:
                await asyncio.to_thread(cgroups.remove, dirs)

    async def _run(self, workdir: Path, code: str, cgroup_dirs: list[Path]) -> SandboxResult:
        # Where the kernel does not cap the directory (no tmpfs mounted on it), its size is measured instead:
        # it may not end a run above the cap (or above its size at the start, when it was already over).
        measured = not os.path.ismount(workdir)
        disk_bound = max(self.limits.disk_bytes, await asyncio.to_thread(_usage, workdir)) if measured else 0
        started = time.time()
        proc = await asyncio.create_subprocess_exec(
            *sandbox_command(self.limits, self.python, workdir, cgroup_dirs),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
            cwd="/",  # not the service's directory (the shell would export it as PWD)
            env=_ENV,  # bwrap itself is pid 1 inside, readable at /proc/1/environ: none of the service's variables
        )
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        budget = [self.limits.output_bytes]
        truncated = asyncio.Event()
        disk_full = asyncio.Event()

        async def feed() -> None:
            assert proc.stdin is not None
            try:
                proc.stdin.write(code.encode("utf-8", "surrogatepass"))
                await proc.stdin.drain()
                proc.stdin.close()
            except (BrokenPipeError, ConnectionResetError, RuntimeError):
                # The process ended before reading its program (uvloop says so with a RuntimeError on the closed
                # transport): its exit status and stderr are the result.
                pass

        async def drain(stream: asyncio.StreamReader, sink: bytearray) -> None:
            while chunk := await stream.read(65536):
                take = min(len(chunk), budget[0])
                sink += chunk[:take]
                budget[0] -= take
                if take < len(chunk) and not truncated.is_set():
                    truncated.set()
                    _kill(proc.pid)  # then read on to the end of the pipe, discarding

        async def watch_disk() -> None:
            while proc.returncode is None:
                await asyncio.sleep(_DISK_POLL_SECONDS)
                if await asyncio.to_thread(_usage, workdir) > disk_bound:
                    disk_full.set()
                    _kill(proc.pid)
                    return

        out, err = bytearray(), bytearray()
        timed_out = False
        watcher = asyncio.ensure_future(watch_disk()) if measured else None
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
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await watcher
            if measured and await asyncio.to_thread(_usage, workdir) > disk_bound:
                # Written between two walks or after the last: this run's newest files go until it fits again.
                disk_full.set()
                await asyncio.to_thread(_trim, workdir, disk_bound, started)
        return SandboxResult(
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            exit_code=proc.returncode,
            timed_out=timed_out,
            output_truncated=truncated.is_set(),
            disk_full=disk_full.is_set(),
        )

    async def probe(self) -> str:
        """Run a trivial program in the sandbox; return what protects it, or raise SandboxUnavailable."""
        for tool in ("bwrap", "prlimit") + (("setpriv",) if os.geteuid() == 0 else ()):
            if shutil.which(tool) is None:
                raise SandboxUnavailable(f"'{tool}' is not installed (Debian: bubblewrap, util-linux)")
        if not Path(self.python).exists():
            raise SandboxUnavailable(f"{self.python} is missing")
        code = "import os\nprint(6 * 7, os.getuid(), 'Seccomp:\\t2' in open('/proc/self/status').read())"
        # A failed trivial run is tried again (a fork refused under a momentary process limit, a busy machine):
        # only a sandbox that fails every time is reported unavailable.
        for attempt in range(_PROBE_ATTEMPTS):
            container = f"probe-{os.getpid()}-{next(_probes)}"  # its own: probes running at once do not collide
            try:
                result = await self.run(container, code, tenant="probe")
                mounted = os.path.ismount(self.root / container)
            except OSError as exc:
                raise SandboxUnavailable(f"cannot start the sandbox: {exc}") from exc
            finally:
                self.remove(container)
            fields = result.stdout.split()
            if fields and fields[0] == "42":
                break
            said = (result.stderr or result.stdout).strip()[-300:]
            reason = f"sandbox probe failed (exit {result.exit_code}): {said}"
            if attempt + 1 == _PROBE_ATTEMPTS:
                raise SandboxUnavailable(reason)
            log.warning("%s; trying again", reason)
            await asyncio.sleep(0.5 * 2**attempt)
        seccomp = "seccomp filter on" if fields[2:] == ["True"] else "NO seccomp filter (install python3-seccomp)"
        return f"bubblewrap sandbox with {self.python}, uid {fields[1]}, {seccomp}; {self.describe_limits(mounted)}"

    def describe_limits(self, work_dir_mounted: bool) -> str:
        """Which mechanism enforces each per-execution limit on this machine."""
        lim, groups = self.limits, self.cgroups
        mib = 1024 * 1024
        if groups.memory:
            memory = f"memory {lim.memory_bytes // mib} MiB per execution ({groups.describe()})"
        else:
            memory = f"memory {lim.memory_bytes // mib} MiB per process only (RLIMIT_AS; no usable memory cgroup)"
        if groups.pids:
            procs = f"{lim.processes} processes per execution ({groups.describe()})"
        else:
            procs = (
                f"processes: RLIMIT_NPROC {uid_processes(self.limits)} shared by all executions"
                " (no usable pids cgroup; one execution may use them all)"
            )
        if work_dir_mounted:
            disk = f"work dir {lim.disk_bytes // mib} MiB / {lim.disk_files} files per container (tmpfs mount)"
        else:
            disk = f"work dir {lim.disk_bytes // mib} MiB per container (measured every {_DISK_POLL_SECONDS}s)"
        return (
            f"{memory}; {procs}; {disk}; /dev/shm {lim.shm_bytes // mib} MiB, /tmp {lim.tmp_bytes // mib} MiB;"
            f" {lim.max_concurrent} executions at once, {lim.max_per_tenant} per project"
        )


def _trim(path: Path, bound: int, since: float) -> None:
    """Delete regular files modified since `since`, newest first, until `path` holds at most `bound` bytes.

    Walks and deletes by directory descriptor, never following links, so code still running in the container
    cannot redirect a deletion outside it by swapping a directory for a symbolic link."""
    used = _usage(path)
    recent: list[tuple[float, int, str, str]] = []
    for dirpath, _, files, dir_fd in os.fwalk(path, follow_symlinks=False):
        for name in files:
            with contextlib.suppress(OSError):
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and st.st_mtime >= since - 1:
                    recent.append((st.st_mtime, st.st_blocks * 512, dirpath, name))
    doomed: set[tuple[str, str]] = set()
    for _, size, dirpath, name in sorted(recent, reverse=True):
        if used <= bound:
            break
        doomed.add((dirpath, name))
        used -= size
    # A second walk deletes by the directory's descriptor (descriptors are not held between the two walks).
    for dirpath, _, files, dir_fd in os.fwalk(path, follow_symlinks=False):
        for name in files:
            if (dirpath, name) in doomed:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=dir_fd)


def _usage(path: Path) -> int:
    """Bytes allocated under `path` (links not followed), as `du` counts them."""
    total = 0
    stack = [str(path)]
    while stack:
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    st = entry.stat(follow_symlinks=False)
                    total += st.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
    return total


def _unmount(path: Path) -> None:
    """Unmount whatever this module mounted on a work directory (nothing when not mounted)."""
    if os.path.ismount(path):
        umount = shutil.which("umount") or "umount"
        subprocess.run([umount, "-l", str(path)], check=False, capture_output=True)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
