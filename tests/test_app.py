"""The app in-process (starlette's TestClient) with an engine double: auth, error mapping, CLI."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from starlette.testclient import TestClient

from service.app import create_app
from service.config import Settings
from service.model_runtime import ModelRuntime
from tests.conftest import ROOT
from tests.doubles import CharFormat, ScriptedEngine


def _app(tmp_path: Path, **settings: object) -> TestClient:
    runtime = ModelRuntime("scripted", ScriptedEngine("ok"), CharFormat())
    config = Settings(database_url=f"sqlite+aiosqlite:///{tmp_path / 'app.db'}", **settings)  # type: ignore[arg-type]
    return TestClient(create_app(config, runtime=runtime))


def test_api_key_is_required_when_configured(tmp_path: Path) -> None:
    with _app(tmp_path, api_key="sesame") as client:
        denied = client.get("/v1/models")
        assert denied.status_code == 401
        assert denied.json()["error"]["type"] == "authentication_error"
        allowed = client.get("/v1/models", headers={"Authorization": "Bearer sesame"})
        assert allowed.status_code == 200 and allowed.json()["data"][0]["id"] == "scripted"
        assert client.get("/health").status_code == 200  # health checks need no key


def test_plain_request_through_the_app(tmp_path: Path) -> None:
    with _app(tmp_path) as client:
        reply = client.post("/v1/responses", json={"input": "hi"})
        assert reply.status_code == 200, reply.text
        assert reply.json()["output"][0]["content"][0]["text"] == "ok"
        wrong_method = client.put("/v1/responses")
        assert wrong_method.status_code == 405
        assert set(wrong_method.json()["error"]) == {"message", "type", "param", "code"}


def test_migrate_and_inspect_commands(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'app.db'}"
    env = {"SERVICE_DATABASE_URL": url, "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-m", "service", "migrate"], cwd=ROOT, env=env, check=True)
    tables = {row[0] for row in sqlite3.connect(tmp_path / "app.db").execute("SELECT name FROM sqlite_master")}
    assert {"events", "run_facts", "runs", "responses", "conversation_items", "conversation_messages"} <= tables
    with _app(tmp_path) as client:
        response_id = client.post("/v1/responses", json={"input": "hi"}).json()["id"]
    shown = subprocess.run(
        [sys.executable, "-m", "service", "inspect", response_id],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert response_id in shown and '"kind": "tokens"' in shown
