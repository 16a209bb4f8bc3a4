"""The forker (tests/process_fork.py) starts `python -m service` processes that behave as fresh ones: the same
output and exit status, the environment they are given, their own pid, signals and kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from tests.cli_helpers import run_cli
from tests.conftest import ROOT, ServerProcess
from tests.process_fork import ForkedProcess, Forker


def _fresh(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "service", *args], cwd=ROOT, capture_output=True, text=True)


def test_a_forked_command_says_what_a_fresh_one_says() -> None:
    for args in (["model", "--help"], ["no-such-command"]):
        fresh, forked = _fresh(*args), run_cli(*args)
        assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert fresh.returncode == 2 and "invalid choice" in fresh.stderr


def test_only_service_settings_may_differ_from_the_forkers_environment() -> None:
    forker = Forker.shared(ROOT)
    env = {**os.environ, "SERVICE_LEASE_SECONDS": "7", "PYTEST_CURRENT_TEST": "another test"}
    assert forker.can_fork(env)
    assert not forker.can_fork({**env, "PROMETHEUS_MULTIPROC_DIR": "/tmp/metrics"})  # read at import time
    assert not forker.can_fork({**env, "SERVICE_VOCAB_CACHE": "/tmp/vocab"})  # the forker's encoding is loaded


def test_a_forked_process_runs_in_its_directory_with_its_environment(tmp_path: Path) -> None:
    database = tmp_path / "forked.db"
    env = {**os.environ, "SERVICE_DATABASE_URL": f"sqlite+aiosqlite:///{database}"}
    process = Forker.shared(ROOT).spawn(["migrate"], env=env, cwd=tmp_path, stdout=tmp_path / "out.txt")
    assert isinstance(process, ForkedProcess) and process.pid != os.getpid()
    assert process.wait(120) == 0, (tmp_path / "out.txt").read_text()
    assert database.is_file() and "0007 (head)" in (tmp_path / "out.txt").read_text()


def test_a_forked_server_is_its_own_process_and_dies_by_kill_9(tmp_path: Path) -> None:
    server = ServerProcess(f"sqlite+aiosqlite:///{tmp_path / 'kill.db'}", tmp_path / "server.log").start()
    process = server.process
    assert isinstance(process, ForkedProcess)
    assert httpx.get(server.url + "/health").status_code == 200
    status = dict(line.split(":\t", 1) for line in Path(f"/proc/{process.pid}/status").read_text().splitlines())
    assert int(status["PPid"]) == Forker.shared(ROOT).pid  # the forker's child, not this worker's
    server.kill()
    assert process.returncode == -signal.SIGKILL
