"""WebSocket mode (`GET /v1/responses` upgraded) through the real server and the official SDK's
`client.responses.connect()`: the same events as SSE, byte for byte what the log replays, every one valid
under the SDK's strict types; continuation on one connection (stored and store=false); the same auth and
errors as HTTP, as `error` events that leave the connection usable; a dropped socket cancels its run."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest
import websockets.sync.client
from openai.resources.responses.responses import ResponsesConnection
from openai.types.responses.responses_server_event import ResponsesServerEvent, ResponseWsError
from pydantic import TypeAdapter
from starlette.types import Message
from starlette.websockets import WebSocket
from websockets.exceptions import InvalidStatus

from service.commands import CreatedResponse
from service.http.auth import ANONYMOUS, AuthFailed, Identity
from service.http.websocket import _Connection, responses_socket
from service.protocol import parse_create_request
from tests.api_helpers import assert_well_formed_stream, client_for, raw_events, sql_rows, wait_until_terminal
from tests.conftest import ServerProcess, app_on_backend
from tests.test_conformance import assert_event_conforms
from tests.test_keys import create_key

MODEL = "random-harmony-tiny"
TERMINAL = {"response.completed", "response.incomplete", "response.failed"}
LONG = 3000  # output tokens: still running when the test hangs up
SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(ResponsesServerEvent)
WS_ERROR: TypeAdapter[Any] = TypeAdapter(ResponseWsError)
ServerFactory = Callable[..., ServerProcess]


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, random_model_dir: Path
) -> Iterator[ServerProcess]:
    yield from app_on_backend(request.param, tmp_path_factory.mktemp(f"websocket-{request.param}"))


@pytest.fixture
def client(server: ServerProcess) -> openai.OpenAI:
    return client_for(server.url)


def _until_terminal(connection: ResponsesConnection) -> list[str]:
    """Raw text frames of one response, through its terminal event (or an error event)."""
    frames = []
    while True:
        raw = connection.recv_bytes().decode()
        frames.append(raw)
        kind = json.loads(raw)["type"]
        if kind in TERMINAL or kind == "error":
            return frames


def _send(connection: ResponsesConnection, event: dict[str, Any]) -> None:
    """A client event as sent by the SDK's connection (raw: tests also send what its types would refuse)."""
    connection.send_raw(json.dumps(event))


def _create(connection: ResponsesConnection, **body: Any) -> list[dict[str, Any]]:
    _send(connection, {"type": "response.create", "model": MODEL, "max_output_tokens": 12, **body})
    return [json.loads(frame) for frame in _until_terminal(connection)]


def _collapsed(kinds: Iterable[str]) -> list[str]:
    """Event types in order, a run of deltas counted once."""
    out: list[str] = []
    for kind in kinds:
        if not (kind.endswith(".delta") and out and out[-1] == kind):
            out.append(kind)
    return out


def test_events_are_the_sse_events_and_what_the_log_replays(client: openai.OpenAI, server: ServerProcess) -> None:
    request = {"input": "Tell me a story", "max_output_tokens": 16, "seed": 5, "temperature": 0}
    with client.responses.connect() as connection:
        _send(connection, {"type": "response.create", "model": MODEL, **request})
        frames = _until_terminal(connection)
    events = [assert_event_conforms(frame) for frame in frames]  # OpenAI's strict ResponseStreamEvent
    for frame in frames:
        SERVER_EVENT.validate_json(frame)  # and the SDK's WebSocket server event union
    assert_well_formed_stream(events)
    response_id = events[0]["response"]["id"]
    # Write before send: every frame is the log's event, byte for byte as the SSE replay's `data:` lines.
    with httpx.stream(
        "GET", f"{server.url}/v1/responses/{response_id}", params={"stream": "true"}, timeout=60
    ) as replay:
        assert [line[6:] for line in replay.iter_lines() if line.startswith("data: ")] == frames
    # The same request over SSE: the same event types in the same order, the same text.
    sse = [
        e.model_dump()
        for e in client.responses.create(
            model=MODEL,
            input="Tell me a story",
            max_output_tokens=16,
            temperature=0,
            stream=True,
            extra_body={"seed": 5},
        )
    ]
    # (how many deltas carry the text depends on how the steps were grouped into commits)
    assert _collapsed(e["type"] for e in sse) == _collapsed(e["type"] for e in events)
    assert sse[-1]["response"]["output"][-1]["content"] == events[-1]["response"]["output"][-1]["content"]
    assert client.responses.retrieve(response_id).status == events[-1]["response"]["status"]


def test_the_sdk_parses_every_event(client: openai.OpenAI) -> None:
    with client.responses.connect() as connection:
        connection.response.create(model=MODEL, input="Hello", max_output_tokens=8)
        kinds = []
        for event in connection:
            kinds.append(event.type)
            if event.type in TERMINAL:
                break
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] in TERMINAL


@pytest.mark.parametrize("store", [True, False])
def test_previous_response_id_continues_on_the_same_connection(
    client: openai.OpenAI, server: ServerProcess, store: bool
) -> None:
    turn = {"seed": 9, "temperature": 0, "store": store}
    with client.responses.connect() as connection:
        first = _create(connection, input="My name is Ada.", **turn)[-1]["response"]
        second = _create(connection, input="What is my name?", previous_response_id=first["id"], **turn)
        third = _create(connection, input="And again?", previous_response_id=second[-1]["response"]["id"], **turn)
    assert first["store"] is store
    for events in (second, third):
        assert events[-1]["type"] in TERMINAL, events[-1]
        assert_well_formed_stream(events)
    assert second[0]["response"]["previous_response_id"] == first["id"]
    # The history was in the prompt: the chain's input grows by the earlier turns' inputs and outputs.
    usage = [first["usage"], second[-1]["response"]["usage"], third[-1]["response"]["usage"]]
    assert usage[1]["input_tokens"] > usage[0]["input_tokens"] + usage[0]["output_tokens"]
    assert usage[2]["input_tokens"] > usage[1]["input_tokens"] + usage[1]["output_tokens"]
    ids = [first["id"], second[-1]["response"]["id"], third[-1]["response"]["id"]]
    if store:
        assert client.responses.retrieve(ids[2]).previous_response_id == ids[1]
        return
    # store=false: never visible over HTTP, not continuable from another connection, gone once the socket closes.
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(ids[0])
    with client.responses.connect() as other:
        refused = _create(other, input="Who am I?", previous_response_id=ids[2])
    assert refused[-1]["type"] == "error" and refused[-1]["error"]["code"] == "previous_response_not_found"
    assert refused[-1]["error"]["param"] == "previous_response_id"
    deadline = time.monotonic() + 30
    while sql_rows(server.database_url, "SELECT id FROM responses WHERE store = false AND id IN (:a, :b, :c)",
                   a=ids[0], b=ids[1], c=ids[2]):  # fmt: skip
        assert time.monotonic() < deadline, "store=false responses outlived their connection"
        time.sleep(0.2)


def test_bad_events_are_error_events_and_the_connection_stays_usable(client: openai.OpenAI) -> None:
    with client.responses.connect() as connection:
        bad: list[tuple[dict[str, Any] | str, str | None, str | None]] = [
            ({"type": "response.create", "model": MODEL, "input": "hi", "no_such_field": 1}, "no_such_field", None),
            ({"type": "response.create", "model": MODEL, "input": "hi", "background": True}, "background", None),
            ({"type": "response.create", "model": MODEL, "input": "hi", "generate": False}, "generate", None),
            ({"type": "response.create", "model": "gpt-unknown", "input": "hi"}, "model", "not_found"),
            ({"type": "response.cancel", "response_id": "resp_1"}, "type", "unknown_event_type"),
            ("{not json", None, "invalid_json"),
        ]
        for event, param, code in bad:
            connection.send_raw(event if isinstance(event, str) else json.dumps(event))
            raw = connection.recv_bytes()
            error = WS_ERROR.validate_json(raw, strict=True).model_dump()
            assert error["status"] in (400, 404) and error["error"]["type"] == "invalid_request_error", error
            assert error["error"]["param"] == param and (code is None or error["error"]["code"] == code), error
        connection.send_raw(json.dumps({"type": "response.steer", "previous_response_id": "resp_x", "input": "go"}))
        steer = connection.parse_event(connection.recv_bytes())
        assert steer.type == "response.steer.failed" and steer.error.code == "steering_not_supported"
        events = _create(connection, input="still here?")  # the same connection still answers
    assert events[-1]["type"] in TERMINAL


def test_a_lane_runs_its_responses_in_order_and_echoes_its_stream_id(client: openai.OpenAI) -> None:
    with client.responses.connect() as connection:
        for text in ("one", "two"):  # the second is sent while the first runs: it waits its turn
            _send(
                connection,
                {"type": "response.create", "model": MODEL, "input": text, "max_output_tokens": 8, "stream_id": "a"},
            )
        first = [json.loads(f) for f in _until_terminal(connection)]
        second = [json.loads(f) for f in _until_terminal(connection)]
    for events in (first, second):
        assert_well_formed_stream(events)
        assert {e["stream_id"] for e in events} == {"a"}
        for event in events:
            SERVER_EVENT.validate_python(event)
    assert first[0]["response"]["id"] != second[0]["response"]["id"]


@pytest.mark.parametrize("how", ["close", "reset"])
def test_dropping_the_socket_cancels_the_run(client: openai.OpenAI, server: ServerProcess, how: str) -> None:
    event = {"type": "response.create", "model": MODEL, "input": "I will hang up", "max_output_tokens": LONG}
    if how == "close":  # the SDK closes the connection (a close frame)
        connection = client.responses.connect().enter()
        _send(connection, event)
        created = json.loads(connection.recv_bytes())
        connection.close()
    else:  # the TCP connection is reset: no close frame at all
        with websockets.sync.client.connect(server.url.replace("http://", "ws://") + "/v1/responses") as ws:
            ws.send(json.dumps(event))
            created = json.loads(ws.recv())
            ws.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            ws.socket.close()
    assert created["type"] == "response.created"
    final = wait_until_terminal(client, created["response"]["id"], timeout=60)
    assert final.status == "cancelled"


async def test_without_the_denial_extension_a_refused_upgrade_is_an_error_event_then_close_1008() -> None:
    """Where the ASGI server cannot answer the handshake with an HTTP response, the refusal is OpenAI's error event."""

    class Refusing:
        async def identify(self, header: bytes | None) -> Identity:
            raise AuthFailed("Invalid API key.")

    app = SimpleNamespace(state=SimpleNamespace(authenticator=Refusing()))
    scope = {"type": "websocket", "path": "/v1/responses", "headers": [], "app": app, "extensions": {}}
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "websocket.connect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await responses_socket(WebSocket(scope, receive, send))
    assert [m["type"] for m in sent] == ["websocket.accept", "websocket.send", "websocket.close"]
    error = WS_ERROR.validate_json(sent[1]["text"], strict=True)
    assert error.status == 401 and error.error.type == "authentication_error" and error.error.code == "invalid_api_key"
    assert sent[2]["code"] == 1008


def test_an_upgrade_without_a_good_key_is_a_401_in_openais_shape(tmp_path: Path, app_factory: ServerFactory) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'service.db'}"
    server = app_factory(url, SERVICE_API_KEY="sk-env-key").start()
    key = create_key(url, "alice", "research")
    ws_url = server.url.replace("http://", "ws://") + "/v1/responses"
    for headers in ({}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": "Basic abc"}):
        with pytest.raises(InvalidStatus) as refused:
            websockets.sync.client.connect(ws_url, additional_headers=headers, open_timeout=30)
        assert refused.value.response.status_code == 401  # never Starlette's bare 403
        body = json.loads(refused.value.response.body or b"{}")
        assert body["error"]["type"] == "authentication_error" and body["error"]["code"] == "invalid_api_key"
    wrong = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(InvalidStatus), wrong.responses.connect():
        pass
    good = openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=60)
    with good.responses.connect() as connection:
        events = _create(connection, input="hello", store=True)
    assert events[-1]["type"] in TERMINAL
    response_id = events[-1]["response"]["id"]
    assert sql_rows(url, "SELECT project FROM responses WHERE id = :id", id=response_id) == [("research",)]
    assert good.responses.retrieve(response_id).id == response_id  # the key's project owns it
    with pytest.raises(openai.NotFoundError):  # and another project's key does not see it
        openai.OpenAI(base_url=server.url + "/v1", api_key="sk-env-key", max_retries=0).responses.retrieve(response_id)


def test_each_response_create_counts_against_the_keys_rate_limit(tmp_path: Path, app_factory: ServerFactory) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'service.db'}"
    server = app_factory(url, SERVICE_API_KEY="sk-env-key", SERVICE_RATE_LIMIT_REQUESTS_PER_MINUTE="2").start()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-env-key", max_retries=0, timeout=60)
    with client.responses.connect() as connection:
        results = [_create(connection, input="hi", max_output_tokens=2)[-1] for _ in range(3)]
    assert [r["type"] in TERMINAL for r in results] == [True, True, False]
    limited = WS_ERROR.validate_python(results[2], strict=True)
    assert limited.status == 429 and limited.error.code == "rate_limit_exceeded"
    assert limited.error.headers is not None and "Retry-After" in limited.error.headers


def test_raw_events_helper_sees_websocket_responses(client: openai.OpenAI, server: ServerProcess) -> None:
    """A response made over a WebSocket is an ordinary response: resumable over SSE from any point."""
    with client.responses.connect() as connection:
        events = _create(connection, input="resume me", store=True)
    response_id = events[0]["response"]["id"]
    assert raw_events(server.url, response_id, after=2) == events[3:]


async def test_a_socket_dropped_while_its_create_commits_still_cancels_the_run() -> None:
    """The lane is cancelled (the socket dropped) after Commands.create began: the create is seen through and the
    run it made is cancelled like any whose client left (forgotten too with store=false)."""
    release = asyncio.Event()
    cancelled: list[tuple[str, bool]] = []

    class SlowCommands:
        async def create(self, create: Any, *, project: str, compaction_item: Any) -> CreatedResponse:
            await release.wait()  # committing
            return CreatedResponse("resp_dropped", {})

        async def cancel_foreground(self, response_id: str, *, project: str, forget: bool = False) -> None:
            cancelled.append((response_id, forget))

    state = SimpleNamespace(commands=SlowCommands(), background_tasks=set())
    connection = _Connection(SimpleNamespace(app=SimpleNamespace(state=state)), ANONYMOUS)  # type: ignore[arg-type]
    lane = asyncio.create_task(connection._create(parse_create_request({"input": "hi", "store": False}), None))
    await asyncio.sleep(0.05)
    lane.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await lane
    await asyncio.gather(*state.background_tasks)
    assert cancelled == [("resp_dropped", True)]


def test_at_most_16_responses_queued_or_running_on_a_connection(client: openai.OpenAI) -> None:
    event = {"type": "response.create", "model": MODEL, "input": "wait in line", "max_output_tokens": LONG}
    with client.responses.connect() as connection:
        for _ in range(17):  # the first runs (for long), 15 wait behind it, the 17th is one too many
            _send(connection, event)
        while (frame := json.loads(connection.recv_bytes()))["type"] != "error":
            pass
    error = WS_ERROR.validate_python(frame, strict=True)
    assert error.status == 400 and error.error.code == "websocket_stream_limit_reached"
