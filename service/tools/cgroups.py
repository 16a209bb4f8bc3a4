"""Per-execution control groups for the sandbox: one child cgroup per run, capping its memory and process count.

Detection (once per process, at the first run) looks, in order, for:
- cgroup v2: the service's own cgroup (from `/proc/self/cgroup` and `/proc/self/mountinfo`) with `memory` and
  `pids` enabled (or enableable) in its `cgroup.subtree_control` -- true on a delegated subtree
  (systemd `Delegate=yes`), false when the service's cgroup holds processes and the controllers are not enabled;
- cgroup v1: the `memory` and `pids` hierarchies, each usable on its own, a child made under the service's own
  cgroup there (so the service's own limits still bound the sandboxes).
A candidate counts only once a probe child could be made, limited and removed. Nothing usable: `Cgroups.kind`
is "none" and the caller falls back to rlimits.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

_counter = itertools.count()


@dataclass(frozen=True)
class Controller:
    """One place child cgroups can be made: `kind` is 'v2', 'memory' or 'pids' (v1 hierarchies)."""

    kind: str
    parent: Path


@dataclass
class Cgroups:
    controllers: list[Controller] = field(default_factory=list)

    @property
    def memory(self) -> bool:
        return any(c.kind in ("v2", "memory") for c in self.controllers)

    @property
    def pids(self) -> bool:
        return any(c.kind in ("v2", "pids") for c in self.controllers)

    def describe(self) -> str:
        if not self.controllers:
            return "no usable cgroup"
        kinds = {c.kind for c in self.controllers}
        return "cgroup v2" if "v2" in kinds else "cgroup v1 " + "+".join(sorted(kinds))

    def create(self, memory_bytes: int, processes: int) -> list[Path]:
        """Make this run's child cgroups with its limits; the directories, whose `cgroup.procs` the run joins."""
        name = f"sandbox-{os.getpid()}-{next(_counter)}"
        made: list[Path] = []
        try:
            for c in self.controllers:
                path = c.parent / name
                path.mkdir()
                made.append(path)
                _limit(c.kind, path, memory_bytes, processes)
        except OSError:
            remove(made)
            raise
        return made


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _limit(kind: str, path: Path, memory_bytes: int, processes: int) -> None:
    if kind == "v2":
        _write(path / "memory.max", str(memory_bytes))
        with contextlib.suppress(OSError):
            _write(path / "memory.swap.max", "0")
        with contextlib.suppress(OSError):
            _write(path / "memory.oom.group", "1")  # an out-of-memory kill takes the whole execution
        _write(path / "pids.max", str(processes))
    elif kind == "memory":
        _write(path / "memory.limit_in_bytes", str(memory_bytes))
        with contextlib.suppress(OSError):  # absent without swap accounting; then swap is not counted
            _write(path / "memory.memsw.limit_in_bytes", str(memory_bytes))
    elif kind == "pids":
        _write(path / "pids.max", str(processes))


def remove(paths: list[Path]) -> None:
    """Kill every process left in these cgroups and remove them (waits up to about a second)."""
    for path in paths:
        with contextlib.suppress(OSError):
            _write(path / "cgroup.kill", "1")  # v2 (Linux 5.14+): one write kills the lot
    deadline = time.monotonic() + 2.0
    pending = [p for p in paths if p.exists()]
    while pending:
        for path in list(pending):
            for pid in _procs(path):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            try:
                path.rmdir()
                pending.remove(path)
            except FileNotFoundError:
                pending.remove(path)
            except OSError:
                pass  # still busy: processes are exiting
        if pending:
            if time.monotonic() > deadline:
                return  # left behind, named by pid; a later start-up does not reuse the name
            time.sleep(0.01)


def _procs(path: Path) -> list[int]:
    try:
        return [int(line) for line in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


@functools.cache
def detect() -> Cgroups:
    """What this process may use (found once); a probe child is made and removed for each candidate."""
    mounts = _mounts()
    own = _own_cgroups()
    v2 = _own_dir(mounts, own, "cgroup2", "")
    if v2 is not None and _enable_v2(v2) and _probe(Controller("v2", v2)):
        return Cgroups([Controller("v2", v2)])
    found = []
    for name in ("memory", "pids"):
        parent = _own_dir(mounts, own, "cgroup", name)
        if parent is not None and _probe(Controller(name, parent)):
            found.append(Controller(name, parent))
    return Cgroups(found)


def _probe(controller: Controller) -> bool:
    try:
        made = Cgroups([controller]).create(64 * 1024 * 1024, 8)
    except OSError:
        return False
    remove(made)
    return True


def _enable_v2(path: Path) -> bool:
    try:
        available = set((path / "cgroup.controllers").read_text().split())
        if not {"memory", "pids"} <= available:
            return False
        enabled = set((path / "cgroup.subtree_control").read_text().split())
        if not {"memory", "pids"} <= enabled:
            _write(path / "cgroup.subtree_control", "+memory +pids")
        return True
    except OSError:
        return False  # e.g. EBUSY: the service's own cgroup holds processes


def _mounts() -> list[tuple[str, Path, str, set[str]]]:
    """(root, mount point, fs type, super options) of every cgroup mount."""
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
                found.append((fields[3], Path(fields[4]), tail[0], set(tail[2].split(","))))
    return found


def _own_cgroups() -> dict[str, str]:
    """Controller name ('' for v2) -> this process's cgroup path in that hierarchy."""
    own: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, names, path = line.split(":", 2)
            for name in names.split(",") if names else [""]:
                own[name] = path
    return own


def _own_dir(mounts: list[tuple[str, Path, str, set[str]]], own: dict[str, str], fstype: str, name: str) -> Path | None:
    if name not in own:
        return None
    for root, point, kind, options in mounts:
        if kind != fstype or (name and name not in options):
            continue
        path = own[name]
        if root != "/" and not (path == root or path.startswith(root.rstrip("/") + "/")):
            continue
        relative = path[len(root) :] if root != "/" else path
        candidate = point / relative.lstrip("/")
        if candidate.is_dir():
            return candidate
    return None
