"""Codex CLI, unmodified, against the real server (issue 38): `codex exec` with a stock config.toml whose only
setting is a custom Responses provider pointed at the test server.

Codex's stock prompt (~5,600 tokens and ~18 tools) is longer than the built-in model's context, so the server
runs a scripted decoder (service/engine/scripted.py) with a 32k context: the protocol, the log, constrained
decoding and the store are the real ones, only the tokens follow a script. `.ci/run` installs the pinned Codex
into .ci/codex (npm); without it (or without node) these tests skip and say so.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.engine.scripted import Rule, write_scripted_model
from tests.conftest import ROOT, InProcessServer, ServerProcess

CODEX_VERSION = "0.171.0"  # what .ci/run installs
CODEX_JS = ROOT / ".ci" / "codex" / "node_modules" / "@openai" / "codex" / "bin" / "codex.js"
NODE = shutil.which("node")

HELLO = "<|channel|>final<|message|>Hello!<|return|>"
DONE = "<|channel|>final<|message|>Done.<|return|>"
# Codex's exec_command takes {"cmd": "<shell command>"}; the constrained decoder writes JSON with ": " and ", ".
COMMAND = "echo codex-was-here > marker.txt"
CALL = (
    "<|channel|>commentary to=functions.exec_command <|constrain|>json<|message|>"
    + json.dumps({"cmd": COMMAND})
    + "<|call|>"
)
# Rules, first match wins: "Say hello" answers; once a tool call is in the prompt, finish; else call the tool.
RULES = [Rule(HELLO, ["Say hello"]), Rule(DONE, ["<|call|>"]), Rule(CALL)]

pytestmark = pytest.mark.skipif(
    NODE is None or not CODEX_JS.is_file(),
    reason=f"Codex CLI not installed: `npm install --prefix .ci/codex @openai/codex@{CODEX_VERSION}` "
    "(.ci/run does it) and node on PATH",
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """On SQLite, logging at info (uvicorn's line for each accepted WebSocket tells the transports apart)."""
    tmp = tmp_path_factory.mktemp("codex")
    model = write_scripted_model(tmp / "scripted-model", RULES)
    url = f"sqlite+aiosqlite:///{tmp / 'service.db'}"
    process = InProcessServer(url, tmp / "server.log", log_level="info", SERVICE_MODEL=str(model)).start()
    try:
        yield process
    finally:
        process.stop()


def _codex_home(tmp: Path, server: ServerProcess, *, websockets: bool = False) -> Path:
    """A stock config: the custom provider and the model, nothing else (and, for WebSocket mode, the
    provider's `supports_websockets`)."""
    home = tmp / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(
        'model = "scripted"\n'
        'model_provider = "local"\n'
        "\n"
        "[model_providers.local]\n"
        'name = "local test server"\n'
        f'base_url = "{server.url}/v1"\n'
        'wire_api = "responses"\n'
        'env_key = "LOCAL_RESPONSES_API_KEY"\n' + ("supports_websockets = true\n" if websockets else "")
    )
    return home


def _scratch_repo(tmp: Path) -> Path:
    repo = tmp / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "README.md").write_text("scratch\n")
    return repo


def codex_exec(
    tmp: Path, server: ServerProcess, prompt: str, *, websockets: bool = False
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`codex exec PROMPT` in a scratch git repository; returns the finished process and the repository."""
    home, repo = _codex_home(tmp, server, websockets=websockets), _scratch_repo(tmp)
    env = {
        **os.environ,
        "CODEX_HOME": str(home),
        "HOME": str(tmp),
        "LOCAL_RESPONSES_API_KEY": "test-key",
        "NO_COLOR": "1",
    }
    assert NODE is not None
    done = subprocess.run(
        [
            NODE,
            str(CODEX_JS),
            "exec",
            "--skip-git-repo-check",
            # The command runs unsandboxed in the scratch repository (no namespaces needed in CI, no approvals).
            "--sandbox",
            "danger-full-access",
            "-c",
            "analytics.enabled=false",  # the machine is offline
            prompt,
        ],
        cwd=repo,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done, repo


def _report(done: subprocess.CompletedProcess[str], server: ServerProcess) -> str:
    log = server.log_path.read_text(errors="replace")[-3000:] if server.log_path.exists() else ""
    return f"exit {done.returncode}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-4000:]}\nserver log:\n{log}"


def _log_size(server: ServerProcess) -> int:
    return server.log_path.stat().st_size


def _refusals(server: ServerProcess, since: int) -> list[str]:
    """Requests the server answered with a 4xx or 5xx since byte `since` of its log (its access log lines)."""
    with server.log_path.open("rb") as log:
        log.seek(since)
        lines = log.read().decode(errors="replace").splitlines()
    refused = []
    for line in lines:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if entry.get("logger") == "service.access" and int(entry.get("status", 0)) >= 400:
            refused.append(line)
    return refused


def _stored_responses(server: ServerProcess) -> list[dict[str, Any]]:
    """Every response the server recorded, oldest first, read straight from its SQLite file."""
    path = server.database_url.split(":///", 1)[1]
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT id, status, store, input_tokens, response FROM responses ORDER BY rowid").fetchall()
    return [
        {"id": r[0], "status": r[1], "store": r[2], "input_tokens": r[3], "body": json.loads(r[4]) if r[4] else None}
        for r in rows
    ]


def test_codex_version() -> None:
    assert NODE is not None
    done = subprocess.run([NODE, str(CODEX_JS), "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and CODEX_VERSION in done.stdout, done.stdout + done.stderr


def test_say_hello_completes_a_turn(tmp_path: Path, server: ServerProcess) -> None:
    before, log_at = len(_stored_responses(server)), _log_size(server)
    done, _ = codex_exec(tmp_path, server, "Say hello")
    assert done.returncode == 0, _report(done, server)
    assert _refusals(server, log_at) == []
    assert done.stdout.strip().splitlines()[-1] == "Hello!", _report(done, server)
    assert "ERROR" not in done.stderr, _report(done, server)
    new = _stored_responses(server)[before:]
    assert [r["status"] for r in new] == ["completed"], new
    output = new[0]["body"]["output"]
    assert [item["type"] for item in output] == ["message"]
    assert output[0]["content"][0]["text"] == "Hello!"


def _websockets_accepted(server: ServerProcess) -> int:
    return server.log_path.read_text(errors="replace").count('\\"WebSocket /v1/responses\\" [accepted]')


@pytest.mark.parametrize("transport", ["http", "websocket"])
def test_exec_command_turn_runs_the_command_and_completes(
    tmp_path: Path, server: ServerProcess, transport: str
) -> None:
    before, sockets, log_at = len(_stored_responses(server)), _websockets_accepted(server), _log_size(server)
    done, repo = codex_exec(tmp_path, server, "Create the marker file", websockets=transport == "websocket")
    assert done.returncode == 0, _report(done, server)
    assert _refusals(server, log_at) == []
    assert (repo / "marker.txt").read_text() == "codex-was-here\n", _report(done, server)
    assert done.stdout.strip().splitlines()[-1] == "Done.", _report(done, server)
    assert "ERROR" not in done.stderr, _report(done, server)
    # With supports_websockets Codex talks over `GET /v1/responses` upgraded (and would fall back to HTTP).
    assert (_websockets_accepted(server) > sockets) == (transport == "websocket"), _report(done, server)
    if transport == "websocket":  # store: false responses made on a socket are forgotten after it closes
        return
    # The turn as the server recorded it: a call of exec_command, then (with its output sent back) the answer.
    new = _stored_responses(server)[before:]
    assert [r["status"] for r in new] == ["completed", "completed"], new
    assert all(not r["store"] for r in new)  # Codex sends store: false and its whole history each time
    assert new[0]["input_tokens"] > 4096 and new[1]["input_tokens"] > new[0]["input_tokens"]  # over the built-in's
    call, answer = new[0]["body"]["output"], new[1]["body"]["output"]
    assert [item["type"] for item in call] == ["function_call"]
    assert call[0]["name"] == "exec_command" and json.loads(call[0]["arguments"]) == {"cmd": COMMAND}
    assert [item["type"] for item in answer] == ["message"]
    assert answer[0]["content"][0]["text"] == "Done."
