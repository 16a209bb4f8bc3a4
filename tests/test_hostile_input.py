"""Hostile and malformed requests, on SQLite and PostgreSQL: each gets the right 4xx in OpenAI's
error shape, the connection stays usable, the server stays healthy, and nothing is stored
(every table is unchanged, and rebuilding the projections from the log gives the same rows)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from service.store import event_log, read_models
from service.store.db import create_engine, migrate
from service.store.rebuild import rebuild_projections
from tests.conftest import ServerProcess

ServerFactory = Callable[..., ServerProcess]
API_KEY = "sk-hostile"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
JSON = {**AUTH, "Content-Type": "application/json"}
TABLES = {
    "events": "SELECT response_id, sequence_number, type, data FROM events ORDER BY position",
    "run_facts": "SELECT response_id, kind, data FROM run_facts ORDER BY position",
    "runs": "SELECT response_id, background, done, cancel_requested FROM runs ORDER BY response_id",
    "responses": "SELECT * FROM responses ORDER BY id",
    "conversation_items": "SELECT * FROM conversation_items ORDER BY response_id, ordinal",
}
PROJECTIONS = ("responses", "conversation_items")


def _nested_schema(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@dataclass
class Case:
    name: str
    status: int
    body: bytes | None = None
    method: str = "POST"
    path: str = "/v1/responses"
    headers: dict[str, Any] = field(default_factory=lambda: dict(JSON))
    param: str | None = None
    says: str = ""  # a word the error message must contain


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


CASES = [
    Case(
        "function_call_output with an unknown call_id",
        400,
        _json({"input": [{"type": "function_call_output", "call_id": "call_nope", "output": "x"}]}),
        param="input[0].call_id",
        says="call_nope",
    ),
    Case("JSON nested 1,000 levels", 400, b'{"input": "x", "metadata": ' + b'{"a":' * 1000 + b"1" + b"}" * 1001),
    Case("an array nested 1,000 levels", 400, b'{"input": ' + b"[" * 1000 + b"]" * 1000 + b"}", says="nested"),
    Case("a lone surrogate in text", 400, b'{"input": "\\ud800"}', says="surrogate"),
    Case(
        "a tool parameters schema nested 300 levels",
        400,
        _json({"input": "x", "tools": [{"type": "function", "name": "f", "parameters": _nested_schema(300)}]}),
        says="nested",
    ),
    Case(
        "a NUL in an item id",
        400,
        _json({"input": [{"type": "message", "role": "user", "content": "x", "id": "msg_\u0000"}]}),
        param="input[0].id",
    ),
    Case(
        "an item id longer than the column",
        400,
        _json({"input": [{"type": "message", "role": "user", "content": "x", "id": "msg_" + "a" * 300}]}),
        param="input[0].id",
    ),
    Case(
        "a NUL in previous_response_id",
        404,
        _json({"input": "x", "previous_response_id": "resp_\u0000"}),
        param="previous_response_id",
    ),
    Case("a NUL in a response id in the path", 404, method="GET", path="/v1/responses/resp_%00x"),
    Case("an over-long response id in the path", 404, method="DELETE", path="/v1/responses/resp_" + "a" * 500),
    Case("'5' for an integer", 400, _json({"input": "x", "max_output_tokens": "5"}), param="max_output_tokens"),
    Case("'true' for a boolean", 400, _json({"input": "x", "stream": "true"}), param="stream"),
    Case("NaN for a number", 400, b'{"input": "x", "temperature": NaN}', says="JSON"),
    Case("a body that is not UTF-8", 400, b'{"input": "\xff\xfe"}', says="JSON"),
    Case("a body that is not an object", 400, b'["input"]', says="object"),
    Case(
        "a text/plain body",
        415,
        _json({"input": "x"}),
        headers={**AUTH, "Content-Type": "text/plain"},
        says="application/json",
    ),
    Case("PUT on /v1/responses", 405, method="PUT", says="POST"),
    Case("a missing endpoint", 404, method="GET", path="/v1/nothing/here", says="GET /v1/nothing/here"),
    Case(
        "a Latin-1 Authorization header",
        401,
        _json({"input": "x"}),
        headers={"Authorization": "Bearer sk-h\xf6stile".encode("latin-1"), "Content-Type": "application/json"},
    ),
    Case(
        "an Authorization header that is not text",
        401,
        _json({"input": "x"}),
        headers={"Authorization": b"Bearer \xff\xfe\x80", "Content-Type": "application/json"},
    ),
    Case("service_tier 'gold'", 400, _json({"input": "x", "service_tier": "gold"}), param="service_tier"),
    Case("a prompt template", 400, _json({"input": "x", "prompt": {"id": "pmpt_1"}}), param="prompt"),
    Case("an unknown conversation", 404, _json({"input": "x", "conversation": "conv_1"}), param="conversation"),
    Case(
        "a conversation and a previous response",
        400,
        _json({"input": "x", "conversation": "conv_1", "previous_response_id": "resp_1"}),
        param="conversation",
    ),
    Case("a conversation id as an object without id", 400, _json({"input": "x", "conversation": {}})),
    Case("a NUL in a conversation id", 404, method="GET", path="/v1/conversations/conv_%00x"),
    Case("an over-long conversation id", 404, method="DELETE", path="/v1/conversations/conv_" + "a" * 500),
    Case("conversation items that are not a list", 400, _json({"items": "x"}), path="/v1/conversations"),
    Case("a conversation update without metadata", 400, _json({}), path="/v1/conversations/conv_1"),
    Case("input_tokens without input", 400, _json({"model": None}), path="/v1/responses/input_tokens"),
    Case(
        "an image",
        400,
        _json(
            {
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_image", "image_url": "https://example.com/a.png"}],
                    }
                ]
            }
        ),
        param="input[0].content[0]",
        says="vision",
    ),
    Case(
        "a file",
        400,
        _json({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file_1"}]}]}),
        says="file",
    ),
    Case("a penalty out of range", 400, _json({"input": "x", "presence_penalty": 3}), param="presence_penalty"),
    Case("stream=maybe on a read", 400, method="GET", path="/v1/responses/resp_x?stream=maybe", param="stream"),
    Case("a negative starting_after", 400, method="GET", path="/v1/responses/resp_x?starting_after=-2"),
    Case("a non-ASCII digit as a page size", 400, method="GET", path="/v1/responses/resp_x/input_items?limit=%D9%A5"),
]


def _snapshot(database_url: str) -> dict[str, list[tuple[Any, ...]]]:
    async def read() -> dict[str, list[tuple[Any, ...]]]:
        db = create_engine(database_url)
        try:
            async with db.connect() as connection:
                return {
                    name: [tuple(row) for row in await connection.execute(sa.text(sql))] for name, sql in TABLES.items()
                }
        finally:
            await db.dispose()

    return asyncio.run(read())


def test_hostile_requests_get_4xx_and_store_nothing(database_url: str, app_factory: ServerFactory) -> None:
    server = app_factory(database_url, SERVICE_API_KEY=API_KEY).start()
    with httpx.Client(base_url=server.url, timeout=60) as http:
        # Something stored already, so "unchanged" is not trivially "empty".
        stored = http.post("/v1/responses", headers=JSON, json={"input": "hello", "max_output_tokens": 4})
        assert stored.status_code == 200
        before = _snapshot(database_url)
        for case in CASES:
            response = http.request(case.method, server.url + case.path, content=case.body, headers=case.headers)
            assert response.status_code == case.status, (case.name, response.status_code, response.text)
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}, case.name
            assert isinstance(error["message"], str) and error["message"], case.name
            assert case.says in error["message"], (case.name, error["message"])
            if case.param is not None:
                assert error["param"] == case.param, (case.name, error)
            if case.status == 405:
                assert response.headers["allow"] == "POST"
            # The keep-alive connection is still usable (or the server said it would close it).
            health = http.get("/health")
            assert health.status_code == 200 or response.headers.get("connection") == "close", case.name
        assert http.get(f"/v1/responses/{stored.json()['id']}", headers=AUTH).json() == stored.json()
    server.stop()
    assert _snapshot(database_url) == before
    asyncio.run(rebuild_projections(database_url))
    rebuilt = _snapshot(database_url)
    assert {name: rebuilt[name] for name in PROJECTIONS} == {name: before[name] for name in PROJECTIONS}


def test_nul_in_input_text_is_stored_exactly(database_url: str, app_factory: ServerFactory) -> None:
    """PostgreSQL text cannot hold NUL: the JSON keeps it escaped, the plain SQL column shows U+FFFD."""
    server = app_factory(database_url).start()
    with httpx.Client(base_url=server.url, timeout=60) as http:
        created = http.post("/v1/responses", json={"input": "a\u0000b", "max_output_tokens": 3})
        assert created.status_code == 200, created.text
        items = http.get(f"/v1/responses/{created.json()['id']}/input_items").json()["data"]
        assert items[0]["content"][0]["text"] == "a\u0000b"
    server.stop()
    text_column = _snapshot(database_url)["conversation_items"][0][6]
    assert text_column == "a\ufffdb"


def test_model_output_with_nul_is_storable(database_url: str) -> None:
    """The group commit's writes (events, output items, the response row) accept a NUL the model produced."""
    item = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "x\u0000y", "annotations": [], "logprobs": []}],
    }
    response = {
        "id": "resp_nul",
        "object": "response",
        "status": "completed",
        "model": "m",
        "created_at": 1,
        "output": [item],
        "store": True,
        "background": False,
    }
    events = [
        {"type": "response.created", "sequence_number": 0, "response": {**response, "output": []}},
        {"type": "response.output_item.done", "sequence_number": 1, "output_index": 0, "item": item},
    ]

    async def write_and_read() -> tuple[dict[str, Any] | None, list[dict[str, Any]], str]:
        await migrate(database_url)
        db = create_engine(database_url)
        try:
            async with db.begin() as connection:
                await event_log.lock_for_append(connection)
                position = await event_log.append_events(connection, "resp_nul", events)
                await read_models.insert_response(connection, response, position=position)
                await read_models.insert_output_items(connection, "resp_nul", events, input_item_count=0)
            async with db.connect() as connection:
                stored = await read_models.get_response(connection, "resp_nul", project=None)
                items = await read_models.list_items(connection, "resp_nul", project=None)
                text = await connection.scalar(sa.text("SELECT text FROM conversation_items"))
            return stored, items, text
        finally:
            await db.dispose()

    stored, items, text = asyncio.run(write_and_read())
    assert stored is not None and stored["output"][0]["content"][0]["text"] == "x\u0000y"
    assert items == [item]
    assert text == "x\ufffdy"


@pytest.mark.parametrize("via", ["query", "header"])
def test_resuming_after_the_terminal_event_ends_at_once(
    via: str, database_url: str, app_factory: ServerFactory
) -> None:
    server = app_factory(database_url).start()
    with httpx.Client(base_url=server.url, timeout=30) as http:
        created = http.post("/v1/responses", json={"input": "x", "max_output_tokens": 3}).json()
        events = [line for line in http.get(f"/v1/responses/{created['id']}?stream=true").text.splitlines() if line]
        last = max(int(line[len("id: ") :]) for line in events if line.startswith("id: "))
        params = {"stream": "true", **({"starting_after": str(last)} if via == "query" else {})}
        headers = {"Last-Event-ID": str(last)} if via == "header" else {}
        # A stream that never ended would raise ReadTimeout here.
        tail = http.get(f"/v1/responses/{created['id']}", params=params, headers=headers)
        assert tail.status_code == 200 and tail.text == ""


async def test_an_unexpected_error_is_a_500_that_keeps_the_connection() -> None:
    """A bug inside a handler answers OpenAI's error shape and is not re-raised to the server
    (which would drop the keep-alive connection without a response)."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from service.app import UnexpectedErrorMiddleware

    async def broken(_request: Request) -> Response:
        raise RuntimeError("a bug")

    app = Starlette(routes=[Route("/broken", broken)], middleware=[Middleware(UnexpectedErrorMiddleware)])
    # raise_app_exceptions: an exception escaping the app would fail this request.
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=True)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        reply = await client.get("/broken")
    assert reply.status_code == 500
    assert reply.json()["error"]["type"] == "server_error"
