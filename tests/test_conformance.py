"""Every object and event the server emits validates against OpenAI's published types
(`openai.types.responses`, strict) and the Open Responses spec's models (`openresponses-types`,
`model_validate_json` strict), through the real server and the real model.

Where the two specs name an event differently, the server keeps OpenAI's name
(`response.reasoning_text.delta` / `.done`, Open Responses: `response.reasoning.delta` / `.done`),
so those events are checked against OpenAI's types only."""

from __future__ import annotations

import enum
import json
import time
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openresponses_types.types as open_responses
import pytest
from openai.types.responses import Response, ResponseItem, ResponseStreamEvent
from pydantic import BaseModel, TypeAdapter

from tests.api_helpers import sql_rows
from tests.conftest import InProcessServer, ServerProcess

OPENAI_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
OPENAI_ITEM: TypeAdapter[Any] = TypeAdapter(ResponseItem)
# OpenAI's names, kept where the Open Responses spec renamed the event.
OPENAI_ONLY_EVENTS = {"response.reasoning_text.delta", "response.reasoning_text.done"}
TOOLS = [{"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}]


def _open_responses_events() -> dict[str, type[BaseModel]]:
    """Event type name -> the Open Responses model for it."""
    by_type: dict[str, type[BaseModel]] = {}
    for name in dir(open_responses):
        model = getattr(open_responses, name)
        if not (isinstance(model, type) and issubclass(model, BaseModel) and name.endswith("StreamingEvent")):
            continue
        annotation = model.model_fields["type"].annotation
        if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
            by_type.update({member.value: model for member in annotation})
        else:
            by_type.update({value: model for value in typing.get_args(annotation)})
    return by_type


OPEN_RESPONSES_EVENTS = _open_responses_events()


def assert_response_conforms(raw: str) -> dict[str, Any]:
    Response.model_validate_json(raw, strict=True)
    open_responses.ResponseResource.model_validate_json(raw, strict=True)
    parsed: dict[str, Any] = json.loads(raw)
    assert isinstance(parsed["created_at"], int)
    assert parsed["completed_at"] is None or isinstance(parsed["completed_at"], int)
    return parsed


def assert_event_conforms(raw: str) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(raw)
    OPENAI_EVENT.validate_json(raw, strict=True)
    if event["type"] not in OPENAI_ONLY_EVENTS:
        OPEN_RESPONSES_EVENTS[event["type"]].model_validate_json(raw, strict=True)
    if "response" in event:
        assert_response_conforms(json.dumps(event["response"]))
    return event


def sse_data(stream: httpx.Response) -> Iterator[str]:
    for line in stream.iter_lines():
        if line.startswith("data: "):
            yield line[len("data: ") :]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, builtin_model_dir: Path) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("conformance")
    process = InProcessServer(f"sqlite+aiosqlite:///{tmp / 'service.db'}", tmp / "server.log").start()
    yield process
    process.stop()


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


def _stream(http: httpx.Client, method: str, url: str, **kwargs: Any) -> list[dict[str, Any]]:
    with http.stream(method, url, **kwargs) as stream:
        assert stream.status_code == 200
        return [assert_event_conforms(raw) for raw in sse_data(stream)]


def test_plain_response_with_logprobs_and_its_reads(http: httpx.Client) -> None:
    body = {"input": "hi", "max_output_tokens": 12, "top_logprobs": 2, "include": ["message.output_text.logprobs"]}
    created = assert_response_conforms(http.post("/v1/responses", json=body).text)
    assert created["presence_penalty"] == 0.0 and created["frequency_penalty"] == 0.0
    assert created["service_tier"] == "default" and created["top_logprobs"] == 2
    assert created["usage"]["total_tokens"] > 0
    retrieved = assert_response_conforms(http.get(f"/v1/responses/{created['id']}").text)
    assert retrieved == created
    items = http.get(f"/v1/responses/{created['id']}/input_items").json()
    for item in items["data"]:
        OPENAI_ITEM.validate_python(item, strict=True)
    replayed = _stream(http, "GET", f"/v1/responses/{created['id']}", params={"stream": "true"})
    assert replayed[-1]["response"] == created


def test_stream_and_its_replay(http: httpx.Client) -> None:
    body = {"input": "Tell", "max_output_tokens": 16, "stream": True, "stream_options": {"include_obfuscation": True}}
    live = _stream(http, "POST", "/v1/responses", json=body)
    deltas = [event for event in live if event["type"].endswith(".delta")]
    assert deltas and all(isinstance(event.get("obfuscation"), str) for event in deltas)
    url = f"/v1/responses/{live[0]['response']['id']}"
    replayed = _stream(http, "GET", url, params={"stream": "true"})
    assert [{k: v for k, v in e.items() if k != "obfuscation"} for e in live] == replayed
    padded = _stream(http, "GET", url, params={"stream": "true", "include_obfuscation": "true"})
    assert all(isinstance(e.get("obfuscation"), str) for e in padded if e["type"].endswith(".delta"))


def test_background_reads_in_progress_then_finishes_with_usage(http: httpx.Client) -> None:
    body = {"input": "A long story", "max_output_tokens": 400, "background": True}
    created = assert_response_conforms(http.post("/v1/responses", json=body).text)
    assert created["status"] == "queued"
    statuses: list[str] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        current = assert_response_conforms(http.get(f"/v1/responses/{created['id']}").text)
        statuses.append(current["status"])
        if current["status"] not in ("queued", "in_progress"):
            break
        if current["output"]:
            # Generating: never "queued" once output exists.
            assert current["status"] == "in_progress", current["status"]
        time.sleep(0.05)
    assert "in_progress" in statuses, statuses
    assert current["status"] in ("completed", "incomplete") and current["usage"]["output_tokens"] > 0


def test_cancelled_background_response(http: httpx.Client) -> None:
    created = http.post("/v1/responses", json={"input": "go on", "max_output_tokens": 2000, "background": True}).json()
    cancelled = assert_response_conforms(http.post(f"/v1/responses/{created['id']}/cancel").text)
    assert cancelled["status"] == "cancelled"
    events = _stream(http, "GET", f"/v1/responses/{created['id']}", params={"stream": "true"})
    assert events[-1]["type"] == "response.incomplete"


def _first_seed_with(http: httpx.Client, item_type: str) -> list[dict[str, Any]]:
    """Random weights: some seeds make the model open a reasoning item or call a tool; find one."""
    for seed in range(40):
        body = {
            "input": "call lookup",
            "max_output_tokens": 24,
            "temperature": 2,
            "seed": seed,
            "tools": TOOLS,
            "stream": True,
        }
        events = _stream(http, "POST", "/v1/responses", json=body)
        if any(e["type"] == "response.output_item.added" and e["item"]["type"] == item_type for e in events):
            return events
    raise AssertionError(f"no seed made the model emit a {item_type} item")


@pytest.mark.parametrize("item_type", ["reasoning", "function_call"])
def test_reasoning_and_function_call_outputs(http: httpx.Client, item_type: str) -> None:
    events = _first_seed_with(http, item_type)
    expected = "response.reasoning_text.delta" if item_type == "reasoning" else "response.function_call_arguments.done"
    assert expected in {event["type"] for event in events}


def test_function_call_round_trip_inputs(http: httpx.Client) -> None:
    body = {
        "input": [
            {"type": "message", "role": "user", "content": "look it up"},
            {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "42"},
        ],
        "tools": TOOLS,
        "max_output_tokens": 8,
        "max_tool_calls": 2,
        "parallel_tool_calls": False,
        "safety_identifier": "user-1",
        "prompt_cache_key": "k",
    }
    created = assert_response_conforms(http.post("/v1/responses", json=body).text)
    assert (created["max_tool_calls"], created["safety_identifier"], created["prompt_cache_key"]) == (2, "user-1", "k")
    items = http.get(f"/v1/responses/{created['id']}/input_items", params={"order": "asc"}).json()["data"]
    assert [item["type"] for item in items] == ["message", "function_call", "function_call_output"]
    for item in items:
        OPENAI_ITEM.validate_python(item, strict=True)


def test_errors_have_openai_shape(http: httpx.Client) -> None:
    for response in (
        http.post("/v1/responses", json={"input": "x", "service_tier": "gold"}),
        http.get("/v1/responses/resp_missing"),
        http.put("/v1/responses"),
        http.get("/v1/nowhere"),
    ):
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
        open_responses.Error.model_validate({**error, "code": error["code"] or ""})


def test_default_output_budget_is_the_rest_of_the_context(http: httpx.Client, server: ServerProcess) -> None:
    created = http.post("/v1/responses", json={"input": "hi", "background": True}).json()
    assert created["max_output_tokens"] is None  # echoed as sent, like OpenAI
    http.post(f"/v1/responses/{created['id']}/cancel")
    (data,) = sql_rows(
        server.database_url, f"SELECT data FROM run_facts WHERE response_id = '{created['id']}' AND kind = 'request'"
    )[0]
    fact = json.loads(data)
    context = http.get("/v1/models").json()["data"][0]["info"]["decoder"]["max_position"]
    assert fact["sampling"]["max_new_tokens"] == context - len(fact["prompt_token_ids"])


def test_truncation_auto_drops_the_oldest_items(http: httpx.Client) -> None:
    history = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: " + "lorem ipsum dolor " * 40}
        for i in range(40)
    ]
    body: dict[str, Any] = {"input": history, "max_output_tokens": 4}
    refused = http.post("/v1/responses", json=body)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"
    assert "truncation" in refused.json()["error"]["message"]
    accepted = http.post("/v1/responses", json={**body, "truncation": "auto"})
    response = assert_response_conforms(accepted.text)
    assert response["truncation"] == "auto"
    assert 0 < response["usage"]["input_tokens"] < 4096
    items = http.get(f"/v1/responses/{response['id']}/input_items", params={"limit": 100, "order": "asc"}).json()
    assert len(items["data"]) == len(history)  # the input as sent stays listed


def test_line_separators_are_escaped_in_sse(http: httpx.Client) -> None:
    instructions = "one\u2028two\u2029three"
    body = {"input": "x", "instructions": instructions, "max_output_tokens": 2, "stream": True}
    with http.stream("POST", "/v1/responses", json=body) as stream:
        raw = stream.read()
    assert "\u2028".encode() not in raw and "\u2029".encode() not in raw
    first = json.loads(raw.decode().split("data: ", 1)[1].split("\n", 1)[0])
    assert first["response"]["instructions"] == instructions


def test_replay_after_the_last_event_of_a_finished_response_is_empty(http: httpx.Client) -> None:
    created = http.post("/v1/responses", json={"input": "x", "max_output_tokens": 2}).json()
    events = _stream(http, "GET", f"/v1/responses/{created['id']}", params={"stream": "true"})
    last = events[-1]["sequence_number"]
    assert (
        _stream(http, "GET", f"/v1/responses/{created['id']}", params={"stream": "true", "starting_after": last}) == []
    )


def test_truncated_inputs_survive_a_projection_rebuild(tmp_path: Path, builtin_model_dir: Path) -> None:
    """truncation='auto' renders fewer items than were sent; the rebuilt input items are still all of them."""
    import asyncio

    from service.store.rebuild import rebuild_projections

    url = f"sqlite+aiosqlite:///{tmp_path / 'service.db'}"
    process = InProcessServer(url, tmp_path / "server.log").start()
    history = [{"role": "user", "content": f"turn {i}: " + "lorem ipsum dolor " * 40} for i in range(40)]
    try:
        created = httpx.post(
            process.url + "/v1/responses",
            json={"input": history, "max_output_tokens": 3, "truncation": "auto"},
            timeout=120,
        )
        assert created.status_code == 200, created.text
    finally:
        process.stop()
    tables = "SELECT * FROM responses ORDER BY id", "SELECT * FROM conversation_items ORDER BY response_id, ordinal"
    before = [sql_rows(url, sql) for sql in tables]
    assert len(before[1]) == len(history) + len(created.json()["output"])
    asyncio.run(rebuild_projections(url))
    assert [sql_rows(url, sql) for sql in tables] == before
