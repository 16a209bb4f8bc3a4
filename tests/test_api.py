"""End to end: the real app (served in this process, tests/conftest.py InProcessServer) on the built-in int8
ONNX model, driven by the official openai client, on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import sqlalchemy as sa
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from service.store.db import create_engine
from tests.api_helpers import (
    assert_well_formed_stream,
    client_for,
    final_text,
    raw_events,
    text_from_deltas,
    wait_until_terminal,
)
from tests.conftest import ServerProcess, app_on_backend

LONG = 3000  # output tokens: long enough to still be running when a test cancels or disconnects


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, random_model_dir: Path
) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp(f"api-{request.param}")
    yield from app_on_backend(request.param, tmp, SERVICE_MAX_BODY_BYTES="200000")


@pytest.fixture
def client(server: ServerProcess) -> openai.OpenAI:
    return client_for(server.url)


def test_plain_request_returns_the_stored_response(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model="random-harmony-tiny", input="Say hello", max_output_tokens=24, extra_body={"seed": 7}
    )
    assert response.id.startswith("resp_")
    assert response.status in ("completed", "incomplete")
    assert response.usage is not None and response.usage.output_tokens <= 24 and response.usage.input_tokens > 0
    again = client.responses.retrieve(response.id)
    assert again.model_dump() == response.model_dump()
    models = client.models.list()
    assert [m.id for m in models.data] == [response.model]


def test_stream_events_are_ordered_and_match_the_stored_response(client: openai.OpenAI, server: ServerProcess) -> None:
    events = [
        e.model_dump()
        for e in client.responses.create(
            input="Tell me a story", max_output_tokens=40, stream=True, extra_body={"seed": 3}
        )
    ]
    assert_well_formed_stream(events)
    types = [e["type"] for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert "response.output_item.added" in types
    added = [e for e in events if e["type"] == "response.output_item.added"]
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert [e["output_index"] for e in added] == [e["output_index"] for e in done] == list(range(len(added)))
    final = events[-1]["response"]
    stored = client.responses.retrieve(final["id"]).model_dump()
    assert stored["status"] == final["status"] and stored["output"] == final["output"]
    # text of every message item is exactly its deltas, reasoning likewise
    assert final_text(stored) == text_from_deltas(events)
    reasoning_deltas = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    reasoning = "".join(p["text"] for i in stored["output"] if i["type"] == "reasoning" for p in i["content"])
    assert reasoning == reasoning_deltas
    # the replay of a finished response is byte-for-byte the same stream
    assert raw_events(server.url, final["id"]) == [json.loads(json.dumps(e)) for e in _as_sent(server, final["id"])]


def _as_sent(server: ServerProcess, response_id: str) -> list[dict[str, Any]]:
    return raw_events(server.url, response_id)


def test_every_event_and_response_validates_against_the_openai_types(server: ServerProcess) -> None:
    """Strict validation (not the client's lenient construction) of what we send."""
    tools = [{"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}]
    for body in (
        {
            "input": "types",
            "max_output_tokens": 60,
            "tools": tools,
            "seed": 2,
            "top_logprobs": 2,
            "include": ["message.output_text.logprobs"],
        },
        {"input": "types", "max_output_tokens": 3, "background": True},
    ):
        created = httpx.post(f"{server.url}/v1/responses", json=body, timeout=60).json()
        Response.model_validate(created)
        events = raw_events(server.url, created["id"])
        adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
        for event in events:
            parsed = adapter.validate_python(event)
            assert parsed.type == event["type"]
        Response.model_validate(httpx.get(f"{server.url}/v1/responses/{created['id']}").json())


def test_logprobs_stream_with_each_delta_and_add_up_in_the_part(client: openai.OpenAI) -> None:
    events = [
        e.model_dump()
        for e in client.responses.create(
            input="with logprobs",
            max_output_tokens=40,
            top_logprobs=3,
            include=["message.output_text.logprobs"],
            stream=True,
            extra_body={"seed": 8},
        )
    ]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and all(e["logprobs"] for e in deltas)
    for entry in (lp for e in deltas for lp in e["logprobs"]):
        assert entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 3
        assert entry["top_logprobs"][0]["logprob"] >= entry["top_logprobs"][-1]["logprob"]
    streamed = [lp for e in deltas for lp in e["logprobs"]]
    stored = client.responses.retrieve(events[-1]["response"]["id"]).model_dump()
    part = next(i for i in stored["output"] if i["type"] == "message")["content"][0]
    assert part["logprobs"] == streamed
    plain = client.responses.create(input="without", max_output_tokens=10)
    assert all(not p.logprobs for i in plain.output if i.type == "message" for p in i.content)  # type: ignore[union-attr]


def test_same_seed_gives_the_same_output(client: openai.OpenAI) -> None:
    first = client.responses.create(input="Repeat after me", max_output_tokens=30, extra_body={"seed": 11})
    second = client.responses.create(input="Repeat after me", max_output_tokens=30, extra_body={"seed": 11})
    assert first.output_text == second.output_text
    assert [i.type for i in first.output] == [i.type for i in second.output]


def test_background_returns_at_once_and_finishes(client: openai.OpenAI) -> None:
    response = client.responses.create(input="Work in the background", max_output_tokens=30, background=True)
    assert response.status in ("queued", "in_progress")
    assert response.background is True
    finished = wait_until_terminal(client, response.id)
    assert finished.status in ("completed", "incomplete")
    assert finished.usage is not None and finished.usage.output_tokens > 0


def test_replay_with_starting_after_continues_a_closed_stream(client: openai.OpenAI, server: ServerProcess) -> None:
    stream = client.responses.create(
        input="Stream in the background", max_output_tokens=120, background=True, stream=True, extra_body={"seed": 5}
    )
    seen: list[dict[str, Any]] = []
    for event in stream:
        seen.append(event.model_dump())
        if len(seen) == 6:
            break
    stream.close()  # the run goes on without us
    response_id = seen[0]["response"]["id"]
    last_seen = seen[-1]["sequence_number"]
    rest = [e.model_dump() for e in client.responses.retrieve(response_id, stream=True, starting_after=last_seen)]
    assert rest[0]["sequence_number"] == last_seen + 1
    whole = seen + rest
    assert_well_formed_stream(whole)
    final = client.responses.retrieve(response_id).model_dump()
    assert final_text(final) == text_from_deltas(whole)
    # The official helper replays from 0 itself and drops what it has seen
    with client.responses.stream(response_id=response_id, starting_after=last_seen) as helper:
        helper_events = [e.model_dump() for e in helper]
    assert [e["sequence_number"] for e in helper_events][0] == last_seen + 1


def test_last_event_id_header_resumes_like_starting_after(client: openai.OpenAI, server: ServerProcess) -> None:
    response = client.responses.create(input="resume me", max_output_tokens=20)
    everything = raw_events(server.url, response.id)
    lines = []
    with httpx.stream(
        "GET", f"{server.url}/v1/responses/{response.id}", params={"stream": "true"}, headers={"Last-Event-ID": "3"}
    ) as stream:
        lines = [line for line in stream.iter_lines() if line.startswith("id: ")]
    assert [int(line[4:]) for line in lines] == [e["sequence_number"] for e in everything[4:]]


def test_cancel_background_run(client: openai.OpenAI, server: ServerProcess) -> None:
    response = client.responses.create(input="a very long task", max_output_tokens=LONG, background=True)
    wait_for_generation(client, response.id)
    cancelled = client.responses.cancel(response.id)
    assert cancelled.status == "cancelled"
    again = client.responses.cancel(response.id)  # idempotent
    assert again.model_dump() == cancelled.model_dump()
    events = raw_events(server.url, response.id)
    assert_well_formed_stream(events)
    assert events[-1]["type"] == "response.incomplete" and events[-1]["response"]["status"] == "cancelled"
    assert cancelled.usage is not None and cancelled.usage.output_tokens < LONG
    assert client.responses.retrieve(response.id).status == "cancelled"


def wait_for_generation(client: openai.OpenAI, response_id: str) -> None:
    """Until the run has produced output (GET folds the in-progress tail of the log)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if client.responses.retrieve(response_id).output:
            return
        time.sleep(0.05)
    raise AssertionError("the run produced no output")


def _first_text(item: Any) -> str:
    return str(item.content[0].text)


def test_cancel_rules(client: openai.OpenAI) -> None:
    plain = client.responses.create(input="plain", max_output_tokens=5)
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.cancel(plain.id)
    assert error.value.body["param"] == "response_id"  # type: ignore[index]
    finished = client.responses.create(input="short", max_output_tokens=5, background=True)
    final = wait_until_terminal(client, finished.id)
    assert client.responses.cancel(finished.id).model_dump() == final.model_dump()
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_does_not_exist")


def test_cancel_racing_completion_has_exactly_one_terminal_event(client: openai.OpenAI, server: ServerProcess) -> None:
    for max_tokens in (1, 3, 8):
        response = client.responses.create(input="race", max_output_tokens=max_tokens, background=True)
        final = client.responses.cancel(response.id)
        assert final.status in ("cancelled", "completed", "incomplete")
        events = raw_events(server.url, response.id)
        assert_well_formed_stream(events)
        assert events[-1]["response"]["status"] == final.status == client.responses.retrieve(response.id).status


def test_client_disconnect_cancels_a_streaming_request(client: openai.OpenAI, server: ServerProcess) -> None:
    stream = client.responses.create(input="I will hang up", max_output_tokens=LONG, stream=True)
    first = next(iter(stream))
    stream.close()
    response_id = first.response.id  # type: ignore[union-attr]
    final = wait_until_terminal(client, response_id, timeout=60)
    assert final.status == "cancelled"


def _sql_scalar(server: ServerProcess, sql: str, **params: Any) -> Any:
    """Read the server's database directly, as a person with sqlite3/psql would."""

    async def query() -> Any:
        db = create_engine(server.database_url)
        try:
            async with db.connect() as connection:
                return await connection.scalar(sa.text(sql), params)
        finally:
            await db.dispose()

    return asyncio.run(query())


def test_client_disconnect_cancels_a_plain_request(client: openai.OpenAI, server: ServerProcess) -> None:
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{server.url}/v1/responses",
            json={"input": "I will not wait", "max_output_tokens": LONG, "metadata": {"test": "plain-disconnect"}},
            timeout=httpx.Timeout(5, read=1.5),
        )
    response_id = _sql_scalar(server, "SELECT id FROM responses WHERE response LIKE '%plain-disconnect%'")
    final = wait_until_terminal(client, response_id, timeout=60)
    assert final.status == "cancelled"


def test_deleting_a_running_response_leaves_nothing_behind(client: openai.OpenAI, server: ServerProcess) -> None:
    response = client.responses.create(input="delete me while I run", max_output_tokens=LONG, background=True)
    wait_for_generation(client, response.id)
    client.responses.delete(response.id)
    time.sleep(1.0)  # the worker's next fenced commit finds the run gone and stops
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    for table in ("events", "run_facts", "runs", "conversation_items"):
        count = _sql_scalar(server, f"SELECT COUNT(*) FROM {table} WHERE response_id = :id", id=response.id)
        assert count == 0, table


def test_delete_removes_events_and_projections(client: openai.OpenAI, server: ServerProcess) -> None:
    response = client.responses.create(input="forget me", max_output_tokens=5)
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list(response.id)
    assert httpx.get(f"{server.url}/v1/responses/{response.id}", params={"stream": "true"}).status_code == 404


def test_input_items_pagination(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": f"message {n}"} for n in range(5)]
    response = client.responses.create(input=messages, max_output_tokens=3)  # type: ignore[arg-type]
    newest_first = client.responses.input_items.list(response.id)
    texts = [_first_text(item) for item in newest_first.data]
    assert texts == [f"message {n}" for n in reversed(range(5))]
    page = client.responses.input_items.list(response.id, order="asc", limit=2)
    assert [_first_text(i) for i in page.data] == ["message 0", "message 1"]
    assert page.has_more is True
    following = client.responses.input_items.list(response.id, order="asc", limit=2, after=page.data[-1].id)
    assert [_first_text(i) for i in following.data] == ["message 2", "message 3"]
    every = list(client.responses.input_items.list(response.id, order="asc", limit=2))  # auto-pagination
    assert len(every) == 5
    # `before` is in OpenAI's API reference but not in this client's signature
    before = client.responses.input_items.list(response.id, order="asc", extra_query={"before": every[2].id})
    assert [i.id for i in before.data] == [every[0].id, every[1].id]
    for bad in ({"limit": 0}, {"limit": 101}, {"order": "sideways"}, {"after": "msg_nope"}):
        with pytest.raises(openai.BadRequestError):
            client.responses.input_items.list(response.id, **bad)


def test_previous_response_id_chain(client: openai.OpenAI, server: ServerProcess) -> None:
    first = client.responses.create(input="My name is Ada.", max_output_tokens=10, instructions="Be brief.")
    second = client.responses.create(input="What is my name?", previous_response_id=first.id, max_output_tokens=10)
    third = client.responses.create(input="And again?", previous_response_id=second.id, max_output_tokens=10)
    assert third.previous_response_id == second.id
    assert first.usage and second.usage and third.usage
    assert first.usage.input_tokens < second.usage.input_tokens < third.usage.input_tokens
    assert [_first_text(i) for i in client.responses.input_items.list(second.id).data] == ["What is my name?"]
    with pytest.raises(openai.NotFoundError) as error:
        client.responses.create(input="x", previous_response_id="resp_missing")
    assert error.value.body["param"] == "previous_response_id"  # type: ignore[index]


def test_function_tools_are_accepted_and_rendered(client: openai.OpenAI) -> None:
    tools = [
        {
            "type": "function",
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        }
    ]
    response = client.responses.create(input="Weather in Paris?", tools=tools, max_output_tokens=30)  # type: ignore[arg-type]
    assert response.tools[0].name == "get_weather"  # type: ignore[union-attr]
    plain = client.responses.create(input="Weather in Paris?", max_output_tokens=30)
    assert response.usage and plain.usage and response.usage.input_tokens > plain.usage.input_tokens
    followup = client.responses.create(
        previous_response_id=response.id,
        max_output_tokens=10,
        tools=tools,  # type: ignore[arg-type]
        input=[
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": '{"temp": 21}'},
        ],
    )
    assert followup.status in ("completed", "incomplete")


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (json.dumps({"input": 5}).encode(), 400, "input"),
        (json.dumps({"input": "x", "temperature": "hot"}).encode(), 400, "temperature"),
        (json.dumps({"input": "x", "frequency_penalty": 3}).encode(), 400, "frequency_penalty"),
        (json.dumps({"input": [{"type": "input_image", "image_url": "x"}]}).encode(), 400, "input[0]"),
        (json.dumps({"input": "x", "model": "gpt-9"}).encode(), 404, "model"),
        (json.dumps({"input": "x", "background": True, "store": False}).encode(), 400, "background"),
        (json.dumps({"input": "x", "max_output_tokens": 0}).encode(), 400, "max_output_tokens"),
        (json.dumps({"input": "x", "tool_choice": "required"}).encode(), 400, "tool_choice"),
        (json.dumps({"input": "x", "include": ["reasoning.unknown"]}).encode(), 400, "include[0]"),
        (json.dumps({"input": "x" * 300_000}).encode(), 413, None),
    ],
)
def test_bad_requests_get_openai_errors(server: ServerProcess, body: bytes, status: int, param: str | None) -> None:
    reply = httpx.post(f"{server.url}/v1/responses", content=body, headers={"content-type": "application/json"})
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param


def test_bad_reads_get_openai_errors(client: openai.OpenAI, server: ServerProcess) -> None:
    response = client.responses.create(input="x", max_output_tokens=3)
    cases = [
        ("/v1/responses/resp_unknown", {}, 404),
        ("/v1/responses/resp_unknown/input_items", {}, 404),
        (f"/v1/responses/{response.id}", {"stream": "true", "starting_after": "abc"}, 400),
        (f"/v1/responses/{response.id}", {"stream": "true", "starting_after": "-5"}, 400),
        (f"/v1/responses/{response.id}", {"stream": "true", "starting_after": "100000"}, 400),
        ("/v1/nothing-here", {}, 404),
    ]
    for path, params, status in cases:
        reply = httpx.get(server.url + path, params=params)
        assert reply.status_code == status, (path, reply.text)
        assert set(reply.json()["error"]) == {"message", "type", "param", "code"}


def test_store_false_is_not_retrievable(client: openai.OpenAI) -> None:
    response = client.responses.create(input="ephemeral", max_output_tokens=5, store=False)
    assert response.status in ("completed", "incomplete")
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_concurrent_requests_all_finish(client: openai.OpenAI) -> None:
    results: list[Any] = []

    def one(n: int) -> None:
        results.append(client.responses.create(input=f"request {n}", max_output_tokens=15))

    threads = [threading.Thread(target=one, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4 and all(r.status in ("completed", "incomplete") for r in results)
