"""`python -m service …` processes forked from a warm parent, one parent per test worker.

A fresh `python -m service serve` spends ~3 of its ~4.5 CPU-seconds of start-up before it reads a setting: the
interpreter, the imports, the Harmony encoding and the o200k grammar tokenizer. The suite starts a few hundred
servers and CLI commands (kill -9, chaos, replicas, restarts, `webhooks …`), on 2 cores. The forker pays that once:
it imports the service and builds both vocabularies, then forks a process for each start, which runs
`service.__main__.main(argv)` with the environment it is given, as `python -m service` does after its imports.

A forked process is a real, separate one: its own pid, signals, kill -9, exit status, output files. The forker is
its parent: it reaps it and reports its exit status to the test worker, where `ForkedProcess` offers the methods
of `subprocess.Popen` that the tests use. (The worker does not adopt the processes as a child subreaper: it would
also adopt every orphan below them, sandboxed processes of another uid among them, whose zombies then count
against that uid's RLIMIT_NPROC.)

Only an environment that differs from the forker's in SERVICE_* variables alone is forked (`can_fork`); anything
else may be read at import time (PROMETHEUS_MULTIPROC_DIR by prometheus_client, SERVICE_VOCAB_CACHE by the cached
encoding) and takes a plain subprocess. Run as `python -m tests.process_fork` by `Forker`, never by hand.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

# Read at import time or cached by the forker before any request: a process that needs another value is not forked.
_FIXED_AT_IMPORT = frozenset({"SERVICE_VOCAB_CACHE"})
# Changed by pytest per test, or set by the service itself to the same value in every process (vocab.py,
# prompting/chat_template.py): no reason not to fork.
_IGNORED = frozenset({"PYTEST_CURRENT_TEST", "TIKTOKEN_ENCODINGS_BASE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"})
# TEST_FORK_SERVERS=0 starts every process from a fresh interpreter instead.
ENABLED = os.environ.get("TEST_FORK_SERVERS", "1") != "0"


class ForkedProcess:
    """A process the forker started, as much of `subprocess.Popen` as the tests use."""

    def __init__(self, pid: int, args: list[str], forker: Forker) -> None:
        self.pid = pid
        self.args = args
        self._forker = forker

    @property
    def returncode(self) -> int | None:
        return self._forker.exit_code(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        code = self._forker.wait_for(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # ended between the poll and the signal, not yet reported
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Forker:
    """The warm parent of this test worker, started on first use (`Forker.shared()`). A thread reads what it
    says: the pid of each process it forked, and each exit status."""

    _shared: Forker | None = None
    _lock = threading.Lock()

    def __init__(self, root: Path) -> None:
        self.env = dict(os.environ)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.process_fork"],
            cwd=root,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._talk = threading.Lock()  # one spawn request at a time: replies come in order
        self._changed = threading.Condition()
        self._pids: list[int] = []  # replies to spawn requests, not yet taken
        self._exits: dict[int, int] = {}
        self._ready = threading.Event()
        threading.Thread(target=self._listen, name="forker-replies", daemon=True).start()
        if not self._ready.wait(120) or self._process.poll() is not None:
            raise RuntimeError(f"the forker did not start (exit {self._process.poll()})")

    @classmethod
    def shared(cls, root: Path) -> Forker:
        with cls._lock:
            if cls._shared is None or cls._shared._process.poll() is not None:
                cls._shared = cls(root)
            return cls._shared

    @classmethod
    def for_env(cls, root: Path, env: dict[str, str], python: str = sys.executable) -> Forker | None:
        """The worker's forker where a `python -m service` process with `env` can be forked from it; None where it
        takes a fresh interpreter (forking turned off, another interpreter, an environment `can_fork` refuses)."""
        if not ENABLED or python != sys.executable:
            return None
        forker = cls.shared(root)
        return forker if forker.can_fork(env) else None

    @property
    def pid(self) -> int:
        return self._process.pid

    def can_fork(self, env: dict[str, str]) -> bool:
        """Whether a process with `env` would run as one started afresh (see the module's docstring)."""
        changed = {k for k in env.keys() | self.env.keys() if env.get(k) != self.env.get(k)} - _IGNORED
        return all(k.startswith("SERVICE_") and k not in _FIXED_AT_IMPORT for k in changed)

    def spawn(
        self, argv: list[str], *, env: dict[str, str], cwd: Path, stdout: Path, stderr: Path | None = None
    ) -> ForkedProcess:
        """`python -m service ARGV` with `env`, in `cwd`, its output appended to `stdout` (and its errors to
        `stderr`, or to `stdout` too)."""
        request = {"argv": argv, "env": env, "cwd": str(cwd), "stdout": str(stdout), "stderr": str(stderr or stdout)}
        with self._talk:
            assert self._process.stdin is not None
            self._process.stdin.write(json.dumps(request) + "\n")
            self._process.stdin.flush()
            with self._changed:
                if not self._changed.wait_for(lambda: self._pids or self._process.poll() is not None, 60):
                    raise RuntimeError("the forker did not answer in 60 s")
                if not self._pids:
                    raise RuntimeError(f"the forker exited with {self._process.poll()}")
                pid = self._pids.pop(0)
        return ForkedProcess(pid, ["python", "-m", "service", *argv], self)

    def exit_code(self, pid: int) -> int | None:
        with self._changed:
            return self._exits.get(pid)

    def wait_for(self, pid: int, timeout: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits, timeout)
            return self._exits.get(pid)

    def _listen(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            said = json.loads(line)
            with self._changed:
                if "pid" in said:
                    self._pids.append(int(said["pid"]))
                elif "exited" in said:
                    self._exits[int(said["exited"])] = int(said["code"])
                self._changed.notify_all()
            if said.get("ready"):
                self._ready.set()
        with self._changed:  # the forker is gone: wake whoever waits
            self._changed.notify_all()


# The forker's side: everything below runs in `python -m tests.process_fork`.


def _preload() -> None:
    """What every `python -m service` process imports and builds before it reads its settings."""
    import service.__main__  # noqa: F401  (the CLI and, through it, the app, the store and the engine)
    import service.app  # noqa: F401
    import service.model_cli  # noqa: F401
    from service.constraints.tokenizer import harmony_tokenizer
    from service.vocab import load_harmony

    harmony_tokenizer(load_harmony())


def _become(request: dict[str, Any]) -> None:
    """In the forked process: take the request's files, directory and environment, run the CLI, exit."""
    out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # also closes the forker's request pipe here
    os.dup2(out, 1)  # and its reply pipe
    os.dup2(err, 2)
    for fd in (out, err, devnull):
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv: list[str] = request["argv"]
    sys.argv = ["python -m service", *argv]
    from service.__main__ import _exit_skipping_teardown, main

    try:
        code = main(argv)
    except SystemExit as exc:  # argparse, as `python -m service` would exit
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:  # as the interpreter ends on an uncaught Ctrl+C: killed by SIGINT
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    # As `python -m service serve` ends; other commands too: the forker's atexit hooks are not theirs to run.
    _exit_skipping_teardown(code)


def _serve_forks() -> None:
    """Fork a process for each request line on stdin; report its pid, then its exit status, on stdout. One thread
    only (a fork copies just the calling thread): requests and SIGCHLD are both read through one selector, stdin
    unbuffered so that the selector sees every byte."""
    _preload()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)  # a handler, so that the wakeup fd is written
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ, "request")
    selector.register(wake_read, selectors.EVENT_READ, "signal")
    _say({"ready": True})
    pending = b""
    while True:
        for key, _ in selector.select():
            if key.data == "signal":
                os.read(wake_read, 4096)
                continue
            data = os.read(0, 1 << 20)
            if not data:  # the test worker is gone
                return
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                pid = os.fork()
                if pid == 0:
                    try:
                        selector.close()
                        signal.set_wakeup_fd(-1)
                        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                        os.close(wake_read)
                        os.close(wake_write)
                        _become(json.loads(line))
                    finally:
                        os._exit(1)
                _say({"pid": pid})
        _reap()


def _say(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _reap() -> None:
    """Report every child that has ended."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _say({"exited": pid, "code": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    _serve_forks()
