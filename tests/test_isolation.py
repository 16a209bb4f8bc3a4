"""Two projects, every endpoint: another project's key gets exactly the 404 an unknown id gets
(no existence oracle), and the owner's key still works. On SQLite and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from tests.api_helpers import sql_rows
from tests.cli_helpers import run_cli
from tests.conftest import ServerProcess

ServerFactory = Callable[..., ServerProcess]


def _key(database_url: str, name: str, project: str) -> str:
    result = run_cli("keys", "create", name, "--project", project, SERVICE_DATABASE_URL=database_url)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def _calls(response_id: str) -> dict[str, tuple[str, str, dict[str, Any]]]:
    """Every path that names a stored response: (method, path, httpx keyword arguments)."""
    path = f"/v1/responses/{response_id}"
    return {
        "retrieve": ("GET", path, {}),
        "replay": ("GET", path, {"params": {"stream": "true"}}),
        "input_items": ("GET", path + "/input_items", {}),
        "cancel": ("POST", path + "/cancel", {}),
        "previous_response_id": (
            "POST",
            "/v1/responses",
            {"json": {"input": "next", "previous_response_id": response_id, "max_output_tokens": 2}},
        ),
        "delete": ("DELETE", path, {}),  # last: the owner's delete really deletes
    }


def _call(url: str, key: str, method: str, path: str, options: dict[str, Any]) -> tuple[int, dict[str, Any] | str]:
    reply = httpx.request(method, url + path, headers={"Authorization": f"Bearer {key}"}, timeout=120, **options)
    if reply.headers.get("content-type", "").startswith("application/json"):
        return reply.status_code, reply.json()
    return reply.status_code, reply.text


def test_another_projects_key_gets_the_unknown_id_404_on_every_path(
    database_url: str, app_factory: ServerFactory
) -> None:
    assert run_cli("migrate", SERVICE_DATABASE_URL=database_url).returncode == 0
    key_a, key_b = _key(database_url, "a", "project-a"), _key(database_url, "b", "project-b")
    server = app_factory(database_url).start()

    status, first = _call(server.url, key_a, "POST", "/v1/responses", {"json": {"input": "1", "max_output_tokens": 3}})
    assert status == 200 and isinstance(first, dict)
    status, created = _call(
        server.url,
        key_a,
        "POST",
        "/v1/responses",
        {"json": {"input": "two", "previous_response_id": first["id"], "background": True, "max_output_tokens": 3}},
    )
    assert status == 200 and isinstance(created, dict)
    response_id = created["id"]
    _wait_until_terminal(server.url, key_a, response_id)
    unknown_id = response_id[:-1] + ("0" if response_id[-1] != "0" else "1")

    for name, (method, path, options) in _calls(response_id).items():
        theirs = _call(server.url, key_b, method, path, options)
        _, unknown_path, unknown_options = _calls(unknown_id)[name]
        unknown = _call(server.url, key_b, method, unknown_path, unknown_options)
        assert theirs[0] == 404, (name, theirs)
        assert theirs == (unknown[0], _swap(unknown[1], unknown_id, response_id)), name
        mine = _call(server.url, key_a, method, path, options)
        assert mine[0] == 200, (name, mine)

    # The owner is a column in SQL, and the view shows it.
    assert sql_rows(database_url, "SELECT project FROM responses WHERE id = :id", id=first["id"]) == [("project-a",)]
    rows = sql_rows(database_url, "SELECT DISTINCT project FROM conversation_messages")
    assert {row[0] for row in rows} <= {"project-a"}
    # B's own data stays B's.
    body = {"json": {"input": "b", "max_output_tokens": 2}}
    status, theirs_created = _call(server.url, key_b, "POST", "/v1/responses", body)
    assert status == 200 and isinstance(theirs_created, dict)
    assert _call(server.url, key_a, "GET", f"/v1/responses/{theirs_created['id']}", {})[0] == 404

    # The owner is in the log too: rebuilding the projections keeps it.
    server.stop()
    assert run_cli("rebuild-projections", SERVICE_DATABASE_URL=database_url).returncode == 0
    owners = dict(sql_rows(database_url, "SELECT id, project FROM responses"))
    assert owners.pop(theirs_created["id"]) == "project-b" and owners[first["id"]] == "project-a"
    assert set(owners.values()) == {"project-a"}


def _conversation_calls(conversation_id: str, item_id: str) -> dict[str, tuple[str, str, dict[str, Any]]]:
    """Every path that names a conversation: (method, path, httpx keyword arguments)."""
    path = f"/v1/conversations/{conversation_id}"
    user = {"type": "message", "role": "user", "content": "more"}
    return {
        "retrieve": ("GET", path, {}),
        "update": ("POST", path, {"json": {"metadata": {"k": "v"}}}),
        "list_items": ("GET", path + "/items", {}),
        "add_items": ("POST", path + "/items", {"json": {"items": [user]}}),
        "get_item": ("GET", f"{path}/items/{item_id}", {}),
        "conversation": (
            "POST",
            "/v1/responses",
            {"json": {"input": "next", "conversation": conversation_id, "max_output_tokens": 2}},
        ),
        "input_tokens": (
            "POST",
            "/v1/responses/input_tokens",
            {"json": {"input": "x", "conversation": conversation_id}},
        ),
        "delete_item": ("DELETE", f"{path}/items/{item_id}", {}),
        "delete": ("DELETE", path, {}),  # last: the owner's delete really deletes
    }


def test_another_projects_key_gets_the_unknown_id_404_on_every_conversation_path(
    database_url: str, app_factory: ServerFactory
) -> None:
    assert run_cli("migrate", SERVICE_DATABASE_URL=database_url).returncode == 0
    key_a, key_b = _key(database_url, "a", "project-a"), _key(database_url, "b", "project-b")
    server = app_factory(database_url).start()

    items = {"items": [{"type": "message", "role": "user", "content": "hello"}]}
    status, conversation = _call(server.url, key_a, "POST", "/v1/conversations", {"json": items})
    assert status == 200 and isinstance(conversation, dict)
    conversation_id = conversation["id"]
    status, listed = _call(server.url, key_a, "GET", f"/v1/conversations/{conversation_id}/items", {})
    assert status == 200 and isinstance(listed, dict)
    item_id = listed["data"][0]["id"]
    unknown_id = conversation_id[:-1] + ("0" if conversation_id[-1] != "0" else "1")

    for name, (method, path, options) in _conversation_calls(conversation_id, item_id).items():
        theirs = _call(server.url, key_b, method, path, options)
        _, unknown_path, unknown_options = _conversation_calls(unknown_id, item_id)[name]
        unknown = _call(server.url, key_b, method, unknown_path, unknown_options)
        assert theirs[0] == 404, (name, theirs)
        assert theirs == (unknown[0], _swap(unknown[1], unknown_id, conversation_id)), name
        if name == "delete":  # before the owner deletes it: the owner is a column, and the view shows it
            query = "SELECT project FROM conversations WHERE id = :id"
            assert sql_rows(database_url, query, id=conversation_id) == [("project-a",)]
            query = "SELECT DISTINCT project FROM conversation_messages WHERE conversation_id = :id"
            assert sql_rows(database_url, query, id=conversation_id) == [("project-a",)]
        mine = _call(server.url, key_a, method, path, options)
        assert mine[0] == 200, (name, mine)
    assert _call(server.url, key_a, "GET", f"/v1/conversations/{conversation_id}", {})[0] == 404

    # B's own conversation stays B's, and the owner is in the log: rebuilding the projections keeps it.
    status, theirs_created = _call(server.url, key_b, "POST", "/v1/conversations", {"json": items})
    assert status == 200 and isinstance(theirs_created, dict)
    assert _call(server.url, key_a, "GET", f"/v1/conversations/{theirs_created['id']}", {})[0] == 404
    status, mine_created = _call(server.url, key_a, "POST", "/v1/conversations", {"json": items})
    assert status == 200 and isinstance(mine_created, dict)
    server.stop()
    assert run_cli("rebuild-projections", SERVICE_DATABASE_URL=database_url).returncode == 0
    owners = dict(sql_rows(database_url, "SELECT id, project FROM conversations"))
    assert owners == {theirs_created["id"]: "project-b", mine_created["id"]: "project-a"}


def _wait_until_terminal(url: str, key: str, response_id: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        _, response = _call(url, key, "GET", f"/v1/responses/{response_id}", {})
        if isinstance(response, dict) and response["status"] not in ("queued", "in_progress"):
            return
        time.sleep(0.1)
    raise AssertionError(f"{response_id} did not finish")


def _swap(value: Any, old: str, new: str) -> Any:
    """`value` with the id `old` replaced by `new` wherever it appears (messages name the id)."""
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, dict):
        return {k: _swap(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_swap(v, old, new) for v in value]
    return value
