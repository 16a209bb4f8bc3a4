"""Running `python -m service ...` as a user would: a process of its own, its exit status and its output."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.conftest import MODEL_CACHE, ROOT
from tests.process_fork import Forker


def run_cli(
    *args: str, cwd: Path = ROOT, python: str = sys.executable, timeout: float = 300, **env: str
) -> subprocess.CompletedProcess[str]:
    """`python -m service ARGS` with SERVICE_* variables from `env` on top of the test environment: forked from the
    worker's warm parent where it can be (tests/process_fork.py), else a fresh interpreter (another `python`)."""
    full_env = {**os.environ, "SERVICE_INTRA_OP_THREADS": "1", "SERVICE_MODEL_CACHE": str(MODEL_CACHE), **env}
    forker = Forker.for_env(ROOT, full_env, python)
    if forker is None:
        return subprocess.run(
            [python, "-m", "service", *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
        )
    with tempfile.TemporaryDirectory(prefix="cli-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        process = forker.spawn(list(args), env=full_env, cwd=cwd, stdout=out, stderr=err)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        return subprocess.CompletedProcess(
            ["python", "-m", "service", *args], code, out.read_text(errors="replace"), err.read_text(errors="replace")
        )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """Exit status 1, no traceback, and stderr is one line starting with `error:` that says each fragment."""
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]
