"""API keys end to end: the CLI creates, lists and revokes them; the server accepts, tracks and
refuses them; only hashes are stored; the server will not listen off loopback without a key; the
0002 migration upgrades a database holding data from revision 0001."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest
from alembic import command

from service.store.db import alembic_config, head_revision, migrate_sync
from tests.api_helpers import sql_rows
from tests.cli_helpers import assert_one_line_error, run_cli
from tests.conftest import ServerProcess

ServerFactory = Callable[..., ServerProcess]


def create_key(database_url: str, name: str, project: str | None = None) -> str:
    args = ["keys", "create", name] + (["--project", project] if project else [])
    result = run_cli(*args, SERVICE_DATABASE_URL=database_url)
    assert result.returncode == 0, result.stderr
    key = result.stdout.strip().splitlines()[-1]
    return key


def client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)


def test_key_lifecycle_through_the_cli_and_the_server(database_url: str, app_factory: ServerFactory) -> None:
    assert run_cli("migrate", SERVICE_DATABASE_URL=database_url).returncode == 0
    key = create_key(database_url, "alice", "research")
    assert key.startswith("sk-svc-") and len(key) >= len("sk-svc-") + 43  # 32 random bytes, base64url
    duplicate = run_cli("keys", "create", "alice", SERVICE_DATABASE_URL=database_url)
    assert_one_line_error(duplicate, "alice", "already exists")

    # Only the SHA-256 is stored, never the key.
    rows = sql_rows(database_url, "SELECT name, project, prefix, key_hash FROM api_keys")
    assert rows == [("alice", "research", key[:13], hashlib.sha256(key.encode()).hexdigest())]

    server = app_factory(database_url).start()
    alice = client(server.url, key)
    response = alice.responses.create(input="hello", max_output_tokens=3)
    assert response.status == "incomplete"
    assert sql_rows(database_url, "SELECT project FROM responses WHERE id = :id", id=response.id) == [("research",)]
    assert sql_rows(database_url, "SELECT project FROM runs WHERE response_id = :id", id=response.id) == [("research",)]

    with pytest.raises(openai.AuthenticationError):
        client(server.url, key + "x").models.list()
    assert httpx.get(server.url + "/v1/models").status_code == 401  # no header at all

    listing = run_cli("keys", "list", SERVICE_DATABASE_URL=database_url)
    assert listing.returncode == 0 and key not in listing.stdout
    line = next(line for line in listing.stdout.splitlines() if line.startswith("alice"))
    assert "research" in line and key[:13] in line and "active" in line and "never" not in line  # used

    revoked = run_cli("keys", "revoke", "alice", SERVICE_DATABASE_URL=database_url)
    assert revoked.returncode == 0, revoked.stderr
    with pytest.raises(openai.AuthenticationError) as refused:
        alice.responses.retrieve(response.id)
    assert refused.value.status_code == 401
    assert "revoked" in run_cli("keys", "list", SERVICE_DATABASE_URL=database_url).stdout
    assert_one_line_error(run_cli("keys", "revoke", "alice", SERVICE_DATABASE_URL=database_url), "no active key")


MALFORMED_HEADERS = {
    "not UTF-8": b"Bearer \xff\xfe",
    "Latin-1": "Bearer sk-h\xf6".encode("latin-1"),
    "wrong scheme": b"Basic dXNlcjpwYXNz",
    "empty key": b"Bearer",
    "empty": b"",
    "no scheme": b"sk-env-key",
}


def test_a_malformed_authorization_header_is_401(tmp_path: Path, app_factory: ServerFactory) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'service.db'}"
    server = app_factory(url, SERVICE_API_KEY="sk-env-key").start()
    for what, header in MALFORMED_HEADERS.items():
        reply = httpx.post(
            server.url + "/v1/responses",
            content=b'{"input": "x"}',
            headers=[(b"Authorization", header), (b"Content-Type", b"application/json")],
        )
        assert reply.status_code == 401, (what, reply.text)
        error = reply.json()["error"]
        assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key", what
        assert reply.headers["x-request-id"]


def test_service_api_key_is_a_key_of_the_default_project(database_url: str, app_factory: ServerFactory) -> None:
    server = app_factory(database_url, SERVICE_API_KEY="sk-env-key").start()
    response = client(server.url, "sk-env-key").responses.create(input="hi", max_output_tokens=2)
    assert sql_rows(database_url, "SELECT project FROM responses WHERE id = :id", id=response.id) == [("default",)]
    # A stored key of another project works beside it, and does not see the default project's data.
    other = create_key(database_url, "bob", "other")
    with pytest.raises(openai.NotFoundError):
        client(server.url, other).responses.retrieve(response.id)


def test_without_a_key_the_server_listens_on_loopback_only(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'service.db'}"
    refused = run_cli("serve", "--host", "0.0.0.0", "--port", "1", "--log-level", "warning", SERVICE_DATABASE_URL=url)
    assert_one_line_error(refused, "no API key is configured", "0.0.0.0", "--allow-unauthenticated")


def test_an_unauthenticated_server_says_so_at_start_up(tmp_path: Path, server_factory: ServerFactory) -> None:
    server = server_factory(f"sqlite+aiosqlite:///{tmp_path / 'service.db'}").start()
    lines = [json.loads(line) for line in server.log_path.read_text().splitlines() if line.startswith("{")]
    assert any(line["message"].startswith("unauthenticated: no API key is configured") for line in lines)


def test_upgrade_from_revision_0001_keeps_data_in_the_default_project(database_url: str) -> None:
    command.upgrade(alembic_config(database_url), "0001")
    statements = [
        "INSERT INTO responses (id, status, model, created_at, background, store, response, last_position) "
        "VALUES ('resp_old', 'completed', 'm', 1.0, false, true, '{}', 1)",
        "INSERT INTO conversation_items (response_id, ordinal, source, item_id, type, role, text, data) "
        "VALUES ('resp_old', 0, 'input', 'msg_1', 'message', 'user', 'hi', '{}')",
        "INSERT INTO runs (response_id, background, done, cancel_requested, claims, enqueued_at) "
        "VALUES ('resp_old', false, true, false, 1, 1.0)",
    ]
    for statement in statements:
        sql_rows(database_url, statement)
    result = migrate_sync(database_url)
    assert (result.before, result.after) == ("0001", head_revision())
    assert sql_rows(database_url, "SELECT project FROM responses") == [("default",)]
    assert sql_rows(database_url, "SELECT project FROM runs") == [("default",)]
    messages = "SELECT conversation_id, text, project FROM conversation_messages"
    assert sql_rows(database_url, messages) == [("resp_old", "hi", "default")]
    assert sql_rows(database_url, "SELECT count(*) FROM api_keys") == [(0,)]
