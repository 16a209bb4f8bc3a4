"""HTTP routes. Handlers translate HTTP to commands and reads; errors are mapped once, in app.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from service.commands import Commands
from service.errors import InvalidRequest, NotFound, ShuttingDown, StoreUnavailable
from service.http.auth import request_project
from service.http.compaction_routes import managed_create, read_create_body
from service.http.include_view import PLAIN_VIEW, IncludeView, hide_outputs, include_view, query_includes
from service.http.openapi import openapi_json
from service.http.paging import page_query
from service.http.sse import sse_frame, tail_event_batches
from service.limits import SubscriberLimit
from service.observability import metrics_endpoint, response_id_var
from service.protocol import TERMINAL_EVENT_TYPES, CreateResponseRequest, parse_create_request
from service.protocol.tools import not_offered
from service.store import event_log, read_models
from service.store.db import head_revision, revision_of

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _commands(request: Request) -> Commands:
    commands: Commands = request.app.state.commands
    return commands


async def create_response(request: Request) -> Response:
    create, compacted = await managed_create(request, parse_create_request(await read_create_body(request)))
    response = await _create(request, create, compacted)
    if unoffered := not_offered(create.tools):  # accepted but not offered to the model: said, not hidden
        response.headers["x-tools-not-offered"] = ",".join(dict.fromkeys(kind for _, kind in unoffered))
    return response


async def _create(request: Request, create: CreateResponseRequest, compacted: dict[str, Any] | None) -> Response:
    commands = _commands(request)
    project = request_project(request)
    view = await include_view(request, create.include)  # before the run: its key read may fail
    created = await commands.create(create, project=project, compaction_item=compacted)
    response_id_var.set(created.response_id)
    if create.stream:
        return _stream(
            request,
            created.response_id,
            project=project,
            after=-1,
            cancel_on_disconnect=not create.background,
            forget_at_end=not create.store,
            obfuscate=bool(create.stream_options and create.stream_options.include_obfuscation),
            view=view,
        )
    if create.background:
        # The Response as created (queued), like OpenAI: the run may already be further along.
        return JSONResponse(created.response)
    return await _wait_for_end(
        request,
        created.response_id,
        project=project,
        forget_at_end=not create.store,
        view=view,
    )


async def _wait_for_end(
    request: Request, response_id: str, *, project: str, forget_at_end: bool, view: IncludeView
) -> Response:
    """A plain request is the stream consumed to its terminal event; a client that leaves cancels it."""
    commands = _commands(request)
    state = request.app.state

    async def consume() -> dict[str, Any]:
        last: dict[str, Any] = {}
        async for batch in tail_event_batches(
            state.db,
            state.notifier,
            response_id,
            after=-1,
            poll_interval=state.settings.poll_interval_seconds,
            draining=state.draining,
            outage_limit=state.settings.store_outage_seconds + 60,
        ):
            last = batch[-1].payload()  # the tail ends at the terminal event
        return last

    consumer = asyncio.create_task(consume())
    watcher = asyncio.create_task(_disconnected(request))
    done, _pending = await asyncio.wait({consumer, watcher}, return_when=asyncio.FIRST_COMPLETED)
    for task in (consumer, watcher):
        task.cancel()
    if watcher in done:
        await commands.cancel_foreground(response_id, project=project, forget=forget_at_end)
        return Response(status_code=499)
    terminal = consumer.result()
    if "response" not in terminal and state.draining.is_set():
        raise ShuttingDown("The server is shutting down; retrieve the response by its id from another replica.")
    if "response" not in terminal:
        raise NotFound(f"Response with id '{response_id}' was deleted while it ran.", param="response_id")
    if forget_at_end:
        await commands.forget_unstored(response_id, project=project)
    return JSONResponse(view.value(terminal["response"]))


async def _disconnected(request: Request) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(0.25)


def _stream(
    request: Request,
    response_id: str,
    *,
    project: str,
    after: int,
    cancel_on_disconnect: bool,
    forget_at_end: bool = False,
    obfuscate: bool = False,
    view: IncludeView = PLAIN_VIEW,
) -> StreamingResponse:
    state = request.app.state
    commands = _commands(request)
    subscribers: SubscriberLimit = state.subscribers
    subscribers.acquire(response_id)  # a 429 before the stream starts

    async def frames() -> AsyncIterator[bytes]:
        finished = False
        try:
            async for batch in tail_event_batches(
                state.db,
                state.notifier,
                response_id,
                after=after,
                poll_interval=state.settings.poll_interval_seconds,
                draining=state.draining,
                outage_limit=state.settings.store_outage_seconds + 60,
                read=state.stream_reader.read_events,
            ):
                # One write per run of events (a replay's page, one commit's events), not one per event.
                yield b"".join(sse_frame(view.event(stored), obfuscate=obfuscate) for stored in batch)
                finished = batch[-1].type in TERMINAL_EVENT_TYPES
            if finished and forget_at_end:
                await commands.forget_unstored(response_id, project=project)
        except StoreUnavailable:
            return  # the store is gone for long: end the stream; the client resumes with starting_after
        finally:
            if cancel_on_disconnect and not finished:
                # We may be inside a cancelled scope: record the cancel from a task of its own.
                task = asyncio.get_running_loop().create_task(
                    commands.cancel_foreground(response_id, project=project, forget=forget_at_end)
                )
                state.background_tasks.add(task)
                task.add_done_callback(state.background_tasks.discard)

    return _HeldStream(frames(), lambda: subscribers.release(response_id))


class _HeldStream(StreamingResponse):
    """An event stream that holds one of its response's subscriber slots until it ends, however it ends."""

    def __init__(self, frames: AsyncIterator[bytes], release: Callable[[], None]) -> None:
        super().__init__(frames, media_type="text/event-stream", headers=SSE_HEADERS)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


async def retrieve_response(request: Request) -> Response:
    response_id = request.path_params["response_id"]
    commands = _commands(request)
    project = request_project(request)
    response_id_var.set(response_id)
    stream, after, obfuscate = _flag(request, "stream"), _starting_after(request), _flag(request, "include_obfuscation")
    view = await include_view(request, query_includes(request))
    response = await commands.get(response_id, project=project)
    if not stream:
        return JSONResponse(view.value(response))
    async with request.app.state.db.connect() as connection:
        last = await event_log.last_event(connection, response_id)
    last_number = -1 if last is None else last.sequence_number
    if after > last_number:
        raise InvalidRequest(
            f"starting_after={after} is past the last event of this response ({last_number}).",
            param="starting_after",
            code="invalid_starting_after",
        )
    if last is not None and after == last_number and last.type in TERMINAL_EVENT_TYPES:
        # Nothing left to send: the stream ends at once.
        return StreamingResponse(_nothing(), media_type="text/event-stream", headers=SSE_HEADERS)
    return _stream(
        request,
        response_id,
        project=project,
        after=after,
        cancel_on_disconnect=False,
        obfuscate=obfuscate,
        view=view,
    )


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""


def _flag(request: Request, name: str) -> bool:
    """A boolean query parameter: 'true' or 'false' (absent = false), nothing else."""
    values = request.query_params.getlist(name)
    if not values:
        return False
    if len(values) > 1 or values[0] not in ("true", "false"):
        raise InvalidRequest(f"{name} must be 'true' or 'false', got {values!r}.", param=name, code="invalid_value")
    return values[0] == "true"


def _starting_after(request: Request) -> int:
    raw = request.query_params.get("starting_after")
    param = "starting_after"
    if raw is None:
        raw, param = request.headers.get("last-event-id"), "Last-Event-ID"
    if raw is None or raw == "":
        return -1
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequest(
            f"{param} must be an integer, got {raw!r}.", param=param, code="invalid_starting_after"
        ) from None
    if value < -1:
        raise InvalidRequest(f"{param} must be -1 or greater.", param=param, code="invalid_starting_after")
    return value


async def cancel_response(request: Request) -> Response:
    response_id = request.path_params["response_id"]
    response_id_var.set(response_id)
    return JSONResponse(hide_outputs(await _commands(request).cancel(response_id, project=request_project(request))))


async def delete_response(request: Request) -> Response:
    response_id = request.path_params["response_id"]
    response_id_var.set(response_id)
    await _commands(request).delete(response_id, project=request_project(request))
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


async def list_input_items(request: Request) -> Response:
    response_id = request.path_params["response_id"]
    query = request.query_params
    paging = page_query(request)
    limit, order = paging.limit, paging.order
    project = request_project(request)
    await _commands(request).get(response_id, project=project)  # 404 for unknown and store=false responses
    async with request.app.state.db.connect() as connection:
        items = await read_models.list_items(connection, response_id, project=project, source="input")
    if order == "desc":
        items.reverse()
    ids = [item["id"] for item in items]
    for cursor_name in ("after", "before"):
        cursor = query.get(cursor_name)
        if cursor is None:
            continue
        if cursor not in ids:
            raise InvalidRequest(f"No input item with id '{cursor}' in this response.", param=cursor_name)
        position = ids.index(cursor)
        if cursor_name == "after":
            items, ids = items[position + 1 :], ids[position + 1 :]
        else:
            items, ids = items[:position], ids[:position]
    page = items[:limit]
    return JSONResponse(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > limit,
        }
    )


async def list_models(request: Request) -> Response:
    runtime = request.app.state.runtime
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {
                    "id": runtime.model_id,
                    "object": "model",
                    "created": int(request.app.state.started_at),
                    "owned_by": "responses-service",
                    "info": await run_in_threadpool(runtime.info),
                },
            ],
        }
    )


async def retrieve_model(request: Request) -> Response:
    runtime = request.app.state.runtime
    if request.path_params["model_id"] != runtime.model_id:
        raise NotFound(f"The model '{request.path_params['model_id']}' does not exist.", param="model")
    return JSONResponse(
        {
            "id": runtime.model_id,
            "object": "model",
            "created": int(request.app.state.started_at),
            "owned_by": "responses-service",
            "info": await run_in_threadpool(runtime.info),
        }
    )


async def health(_request: Request) -> Response:
    """Liveness: the process answers. Nothing about its internals."""
    return JSONResponse({"status": "ok"})


READY_TIMEOUT_SECONDS = 2.0


async def ready(request: Request) -> Response:
    """Readiness: the database answers and is at the head revision, the model is loaded, the run
    loop is alive, and the server is not draining. 503 (with the failing checks) otherwise."""
    state = request.app.state
    checks: dict[str, bool] = {
        "database": False,
        "model": getattr(state, "runtime", None) is not None,
        "run_loop": state.supervisor.alive(),
        "accepting": not state.draining.is_set(),
    }
    try:
        async with asyncio.timeout(READY_TIMEOUT_SECONDS), state.db.connect() as connection:
            checks["database"] = await connection.run_sync(revision_of) == head_revision()
    except Exception:  # noqa: BLE001 - unreachable, timed out or not migrated: not ready, whatever the cause
        checks["database"] = False
    ok = all(checks.values())
    return JSONResponse({"status": "ok" if ok else "unavailable", "checks": checks}, status_code=200 if ok else 503)


async def response_resource(request: Request) -> Response:
    if request.method == "DELETE":
        return await delete_response(request)
    return await retrieve_response(request)


routes = [
    Route("/v1/responses", create_response, methods=["POST"]),
    Route("/v1/responses/{response_id}", response_resource, methods=["GET", "DELETE"]),
    Route("/v1/responses/{response_id}/cancel", cancel_response, methods=["POST"]),
    Route("/v1/responses/{response_id}/input_items", list_input_items, methods=["GET"]),
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/models/{model_id:path}", retrieve_model, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
    Route("/ready", ready, methods=["GET"]),
    Route("/metrics", metrics_endpoint, methods=["GET"]),
    Route("/openapi.json", openapi_json, methods=["GET"]),
]
