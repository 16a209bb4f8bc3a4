"""WebSocket mode (`GET /v1/responses` upgraded), as OpenAI documents it: a transport only.

Each `response.create` client event is decoded into the command `POST /v1/responses` with `stream: true` makes
(same body parsing, limits and errors), and its events are read from the log and sent one text frame each, the
JSON of the SSE `data:` lines byte for byte (write before send holds: nothing is sent that is not committed).

- Auth: the upgrade's `Authorization` header, checked by the same Authenticator as HTTP; a missing or wrong key
  is refused at the handshake with HTTP 401 and OpenAI's JSON error body (or, where the ASGI server cannot send
  a denial response, an `error` event and close code 1008). Limits: each `response.create` counts one request
  against the key's rate limit; runs per project and the queue bound are checked by the create command.
- Lanes: `stream_id` names a lane; a lane runs its responses one at a time, in order (a `response.create` sent
  while one runs waits for it), lanes run side by side; at most MAX_IN_FLIGHT responses queued or running on a
  connection. Events of a response created with a `stream_id` echo it.
- Errors are `{"type": "error", "status": <HTTP status>, "error": {type, code, message, param}}` events and leave
  the connection usable; `background: true` and `generate: false` are refused; `response.steer` is answered
  `response.steer.failed` (`steering_not_supported`).
- A dropped socket ends its foreground runs as a dropped SSE client does (Commands.cancel_foreground).
- `store: false`: like OpenAI, a response is kept for the connection that made it, so `previous_response_id`
  may continue from it on that connection (`prompt_assembly.continuable_unstored`); all are forgotten when the
  connection closes, as SSE forgets one when its stream ends."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import WebSocketRoute
from starlette.types import Message
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from service.commands import Commands, CreatedResponse
from service.errors import ApiError, InvalidRequest, NotFound, ServerError, StoreUnavailable, Unauthorized
from service.http.auth import ANONYMOUS, Authenticator, AuthFailed, Identity
from service.http.body import parse_json
from service.http.compaction_routes import managed_create, read_create_body
from service.http.include_view import IncludeView, include_view
from service.http.sse import event_json, tail_event_batches
from service.limits import RateLimited
from service.observability import project_var, response_id_var
from service.prompt_assembly import continuable_unstored
from service.protocol import TERMINAL_EVENT_TYPES, CreateResponseRequest, parse_create_request
from service.store.faults import is_transient

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 16  # responses queued or running on one connection, as OpenAI allows
POLICY_VIOLATION = 1008  # close code after an error event refusing the connection
CLOSE_RESTARTING = 1012  # the server is draining: clients reconnect (the SDK retries this code)
_ENVELOPE = ("type", "stream_id", "generate")  # WebSocket-only fields, not part of the create body
_BODY_HEADERS = (b"content-type", b"content-length", b"content-encoding")  # the upgrade's, not the event's


def error_event(error: ApiError, *, stream_id: str | None = None) -> dict[str, Any]:
    """OpenAI's WebSocket `error` event for an error HTTP would answer with `error.status_code`."""
    body = error.body()["error"]
    headers = getattr(error, "headers", None)
    if headers:
        body["headers"] = dict(headers)
    event: dict[str, Any] = {"type": "error", "status": error.status_code, "error": body}
    if stream_id is not None:
        event["stream_id"] = stream_id
    return event


class _Connection:
    """One upgraded socket: the receive loop, its lanes, and the store=false responses it may continue from."""

    def __init__(self, websocket: WebSocket, identity: Identity) -> None:
        self.websocket = websocket
        self.identity = identity
        self.state = websocket.app.state
        self.commands: Commands = self.state.commands
        self.lanes: dict[str | None, asyncio.Queue[dict[str, Any]]] = {}
        self.workers: list[asyncio.Task[None]] = []
        self.in_flight = 0
        self.unstored: set[str] = set()
        self.send_lock = asyncio.Lock()
        self.closed = False

    async def serve(self) -> None:
        try:
            while not self.closed:
                try:
                    message = await self.websocket.receive()
                except (RuntimeError, WebSocketDisconnect):
                    break  # closed by the server (draining) while waiting
                if message["type"] == "websocket.disconnect":
                    break
                await self._dispatch(message)
        except _ClientGone:
            pass
        finally:
            self.closed = True
            for worker in self.workers:
                worker.cancel()
            await asyncio.gather(*self.workers, return_exceptions=True)
            for response_id in self.unstored:  # runs already ended are forgotten at once
                self._later(self.commands.cancel_foreground(response_id, project=self.identity.project, forget=True))

    async def _dispatch(self, message: Message) -> None:
        raw = message.get("text")
        data = raw.encode() if isinstance(raw, str) else message.get("bytes") or b""
        try:
            limit: int = self.state.settings.max_body_bytes
            if len(data) > limit:
                raise InvalidRequest(f"The event exceeds {limit} bytes.", code="payload_too_large")
            event = parse_json(data)
            if not isinstance(event, dict):
                raise InvalidRequest("A client event must be a JSON object.", code="invalid_json")
            kind = event.get("type")
            if kind == "response.steer":
                await self._steer_failed(event)
                return
            if kind != "response.create":
                raise InvalidRequest(
                    f"Unknown client event type {kind!r}: this server accepts 'response.create' and 'response.steer'.",
                    param="type",
                    code="unknown_event_type",
                )
            stream_id = event.get("stream_id")
            if stream_id is not None and not isinstance(stream_id, str):
                raise InvalidRequest("stream_id must be a string.", param="stream_id", code="invalid_type")
        except ApiError as exc:
            await self._send(error_event(exc))
            return
        if self.in_flight >= MAX_IN_FLIGHT:
            error = InvalidRequest(
                f"This connection already has {self.in_flight} responses queued or running (limit {MAX_IN_FLIGHT}).",
                code="websocket_stream_limit_reached",
            )
            await self._send(error_event(error, stream_id=stream_id))
            return
        self.in_flight += 1
        lane = self.lanes.get(stream_id)
        if lane is None:
            lane = self.lanes[stream_id] = asyncio.Queue()
            self.workers.append(asyncio.create_task(self._run_lane(lane), name=f"websocket-lane-{stream_id}"))
        lane.put_nowait(event)

    async def _run_lane(self, lane: asyncio.Queue[dict[str, Any]]) -> None:
        project_var.set(self.identity.project)
        while True:
            event = await lane.get()
            stream_id = event.get("stream_id")
            try:
                await self._respond(event, stream_id)
            except _ClientGone:
                return  # the receive loop sees the disconnect and ends the connection
            except ApiError as exc:
                await self._send(error_event(_as_websocket_error(exc), stream_id=stream_id))
            except Exception as exc:
                # As UnexpectedErrorMiddleware answers HTTP: the error in OpenAI's shape; the connection stays.
                error: ApiError
                if is_transient(exc):
                    log.warning("store unavailable: %s", exc)
                    error = StoreUnavailable("The event store is unavailable; retry shortly.")
                else:
                    log.exception("unhandled error", exc_info=exc)
                    error = ServerError("The server had an error while processing your request.")
                await self._send(error_event(error, stream_id=stream_id))
            finally:
                self.in_flight -= 1

    async def _respond(self, event: dict[str, Any], stream_id: str | None) -> None:
        """The create of `POST /v1/responses` with stream=true, then its events from the log."""
        self._check_rate()
        if event.get("background") is True:
            raise InvalidRequest(
                "background is not supported in WebSocket mode; use POST /v1/responses for background responses.",
                param="background",
                code="unsupported_parameter",
            )
        if event.get("generate") is False:
            raise InvalidRequest(
                "generate: false (warm-up) is not supported by this server; send the turn itself.",
                param="generate",
                code="unsupported_parameter",
            )
        body = {name: value for name, value in event.items() if name not in _ENVELOPE}
        body.update(stream=True)
        body.pop("background", None)
        request = self._request(json.dumps(body, ensure_ascii=False).encode())
        token = continuable_unstored.set(frozenset(self.unstored))
        try:
            create, compacted = await managed_create(request, parse_create_request(await read_create_body(request)))
            view = await include_view(request, create.include)
            created = await self._create(create, compacted)
        finally:
            continuable_unstored.reset(token)
        response_id_var.set(created.response_id)
        if not create.store:
            self.unstored.add(created.response_id)
        obfuscate = bool(create.stream_options and create.stream_options.include_obfuscation)
        await self._stream(created.response_id, stream_id=stream_id, view=view, obfuscate=obfuscate)

    async def _create(self, create: CreateResponseRequest, compacted: dict[str, Any] | None) -> CreatedResponse:
        """Commands.create, seen through when the socket drops meanwhile: a run it made is then cancelled like any
        whose client left, never left running for no one."""
        creating = asyncio.ensure_future(
            self.commands.create(create, project=self.identity.project, compaction_item=compacted)
        )
        try:
            return await asyncio.shield(creating)
        except asyncio.CancelledError:
            self._later(self._cancel_once_created(creating, forget=not create.store))
            raise

    async def _cancel_once_created(self, creating: asyncio.Future[CreatedResponse], *, forget: bool) -> None:
        created = await creating
        await self.commands.cancel_foreground(created.response_id, project=self.identity.project, forget=forget)

    def _request(self, body: bytes) -> Request:
        """The HTTP request this event stands for: the upgrade's scope (its state holds the key's project), the
        event's fields as a JSON body, so that the create path is HTTP's own."""
        sent = False

        async def receive() -> Message:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        headers = [(k, v) for k, v in self.websocket.scope["headers"] if k not in _BODY_HEADERS]
        scope = {**self.websocket.scope, "type": "http", "method": "POST", "headers": headers}
        return Request(scope, receive)

    def _check_rate(self) -> None:
        """Requests per minute per key, as RateLimitMiddleware counts HTTP requests: one per response.create."""
        limiter = getattr(self.state, "rate_limiter", None)
        key_name = self.identity.key_name
        if key_name is None or limiter is None or limiter.per_minute == 0:
            return
        decision = limiter.check(key_name)
        if not decision.allowed:
            raise RateLimited(
                f"Rate limit reached: {limiter.per_minute} requests per minute for this key. "
                f"Retry in {decision.retry_after:.1f}s.",
                code="rate_limit_exceeded",
                retry_after=decision.retry_after,
                headers=decision.headers(),
            )

    async def _stream(self, response_id: str, *, stream_id: str | None, view: IncludeView, obfuscate: bool) -> None:
        """Like routes._stream: replay then tail the log; a client gone before the end cancels the run."""
        state = self.state
        state.subscribers.acquire(response_id)
        finished = False
        try:
            async for batch in tail_event_batches(
                state.db,
                state.notifier,
                response_id,
                after=-1,
                poll_interval=state.settings.poll_interval_seconds,
                draining=state.draining,
                outage_limit=state.settings.store_outage_seconds + 60,
                read=state.stream_reader.read_events,
            ):
                frames = [event_json(view.event(s), obfuscate=obfuscate) for s in batch]
                if stream_id is not None:
                    frames = [_with_stream_id(frame, stream_id) for frame in frames]
                await self._send_frames(frames)
                finished = batch[-1].type in TERMINAL_EVENT_TYPES
            if not finished and state.draining.is_set():
                await self._close(CLOSE_RESTARTING, "The server is restarting; reconnect and retrieve the response.")
        except StoreUnavailable as exc:
            await self._send(error_event(exc, stream_id=stream_id))
        finally:
            state.subscribers.release(response_id)
            if not finished:
                # We may be inside a cancelled task: record the cancel from a task of its own.
                forget = response_id in self.unstored
                self._later(self.commands.cancel_foreground(response_id, project=self.identity.project, forget=forget))
                self.unstored.discard(response_id)

    async def _steer_failed(self, event: dict[str, Any]) -> None:
        """Steering is not supported: the input is handed back, as OpenAI does for a response that cannot take it."""
        steer = {"input": event.get("input", ""), "previous_response_id": str(event.get("previous_response_id", ""))}
        error = {
            "type": "invalid_request_error",
            "code": "steering_not_supported",
            "message": "This server does not support steering; send the input with the next response.create.",
        }
        await self._send({"type": "response.steer.failed", "sequence_number": 0, "error": error, "steer": steer})

    async def _send(self, event: dict[str, Any]) -> None:
        await self._send_frames([json.dumps(event, ensure_ascii=False, separators=(",", ":"))])

    async def _send_frames(self, frames: list[str]) -> None:
        async with self.send_lock:  # a frame of one lane is never cut into by another's
            try:
                for frame in frames:
                    await self.websocket.send_text(frame)
            except Exception as exc:  # the client is gone: the ASGI server's exception depends on the server
                raise _ClientGone from exc

    async def _close(self, code: int, reason: str) -> None:
        self.closed = True
        async with self.send_lock:
            if self.websocket.application_state != WebSocketState.DISCONNECTED:
                with contextlib.suppress(Exception):
                    await self.websocket.close(code, reason)

    def _later(self, work: Awaitable[None]) -> None:
        """Work that must outlive the connection's tasks (a cancel, a forget), held like SSE's."""

        async def run() -> None:
            with contextlib.suppress(Exception):
                await work

        task = asyncio.get_running_loop().create_task(run())
        self.state.background_tasks.add(task)
        task.add_done_callback(self.state.background_tasks.discard)


class _ClientGone(Exception):
    """A send found the socket closed."""


def _with_stream_id(frame: str, stream_id: str) -> str:
    return json.dumps({**json.loads(frame), "stream_id": stream_id}, ensure_ascii=False, separators=(",", ":"))


def _as_websocket_error(error: ApiError) -> ApiError:
    """OpenAI's WebSocket mode names a previous response it cannot continue from `previous_response_not_found`
    (clients such as Codex retry with the full input on that code)."""
    if isinstance(error, NotFound) and error.param == "previous_response_id":
        return InvalidRequest(error.message, param=error.param, code="previous_response_not_found")
    return error


async def _identify(websocket: WebSocket) -> Identity | None:
    """The key's identity, or None once the upgrade has been refused in OpenAI's error shape."""
    authenticator: Authenticator | None = getattr(websocket.app.state, "authenticator", None)
    if authenticator is None:
        return ANONYMOUS
    error: ApiError
    try:
        return await authenticator.identify(dict(websocket.scope["headers"]).get(b"authorization"))
    except AuthFailed as exc:
        error = Unauthorized(str(exc))
    except Exception as exc:
        if not is_transient(exc):
            raise
        error = StoreUnavailable("The event store is unavailable; retry shortly.")
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(JSONResponse(error.body(), status_code=error.status_code))
    else:
        await websocket.accept()
        await websocket.send_text(json.dumps(error_event(error)))
        await websocket.close(POLICY_VIOLATION, "authentication failed")
    return None


async def responses_socket(websocket: WebSocket) -> None:
    identity = await _identify(websocket)
    if identity is None:
        return
    state = websocket.scope.setdefault("state", {})
    state["project"], state["key_name"] = identity.project, identity.key_name
    project_var.set(identity.project)
    await websocket.accept()
    connection = _Connection(websocket, identity)
    await connection.serve()
    await connection._close(1000, "")


routes = [WebSocketRoute("/v1/responses", responses_socket)]
