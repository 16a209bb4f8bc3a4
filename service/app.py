"""The composition root: wires settings, store, model, supervisor and routes. Nothing imports it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy.engine import make_url
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import stream_archive
from service.agent.runtime import ToolRuntime
from service.commands import Commands
from service.config import Settings
from service.containers import Containers
from service.errors import ApiError, MethodNotAllowed, NotFound, ServerError, StoreUnavailable
from service.http.auth import Authenticator, AuthMiddleware
from service.http.compaction_routes import routes as compaction_routes
from service.http.container_routes import routes as container_routes
from service.http.conversation_routes import routes as conversation_routes
from service.http.routes import routes
from service.http.websocket import routes as websocket_routes
from service.limits import RateLimitMiddleware, RequestRateLimiter, SubscriberLimit
from service.model_runtime import ModelRuntime
from service.models import load_runtime
from service.notify import Notifier
from service.observability import RequestContextMiddleware
from service.runs import RunSupervisor
from service.store import retention
from service.store.db import create_engine, is_sqlite, migrate
from service.store.faults import is_transient
from service.tools import report_sandbox, sandbox_from_settings
from service.tools.mcp_policy import McpAddressPolicy
from service.webhooks.delivery import DeliveryWorker

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None, *, runtime: ModelRuntime | None = None) -> Starlette:
    """`runtime` lets tests inject an engine double; the server always loads a real model."""
    settings = settings or Settings.from_env()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await migrate(settings.database_url)
        db = create_engine(settings.database_url, busy_timeout=min(30.0, settings.store_outage_seconds))
        model = runtime or load_runtime(settings)
        notifier = Notifier()
        if not is_sqlite(settings.database_url):
            url = make_url(settings.database_url).set(drivername="postgresql")
            await notifier.start_postgres(url.render_as_string(hide_password=False))
        state = app.state
        state.authenticator = Authenticator(db, settings.api_key)
        await state.authenticator.required()  # read while the store is surely up
        sandbox_unavailable = await report_sandbox(settings)  # None when the code interpreter can run
        sandbox = sandbox_from_settings(settings)
        containers = state.containers = Containers(db, sandbox)
        # The server-side tools, shared by the commands and the supervisor. Where MCP connections may go depends on
        # whether keys are configured (service/tools/mcp.py).
        policy = McpAddressPolicy(tuple(settings.mcp_hosts()), settings.listen_host, state.authenticator.required)
        tools = ToolRuntime.build(
            settings,
            policy=policy,
            sandbox=sandbox,
            sandbox_unavailable=sandbox_unavailable,
            containers=containers,
        )
        supervisor = RunSupervisor(db, model, notifier, settings, tools=tools)
        state.settings, state.db, state.runtime, state.notifier = settings, db, model, notifier
        state.supervisor, state.started_at, state.background_tasks = supervisor, time.time(), set()
        state.draining = asyncio.Event()
        state.stream_reader = stream_archive.StreamReader(model.chat_format)  # fills archived streams
        state.commands = Commands(db, model, supervisor, notifier, settings, tools=tools)
        state.rate_limiter = RequestRateLimiter(settings.rate_limit_requests_per_minute)
        state.subscribers = SubscriberLimit(settings.max_sse_subscribers_per_response)
        await supervisor.start()
        sweeper = asyncio.create_task(
            retention.run_sweeper(
                db,
                retention_days=settings.retention_days,
                interval_seconds=settings.retention_sweep_seconds,
                batch_size=settings.retention_batch_size,
                compaction_grace=settings.log_compaction_grace_seconds,
                archive_streams=lambda batch: stream_archive.archive_streams(
                    db, model.chat_format, window_seconds=settings.replay_window_seconds, batch_size=batch
                ),
                sweep_containers=lambda batch: containers.sweep(batch_size=batch),
            ),
            name="retention-sweeper",
        )
        webhooks = DeliveryWorker(settings, settings.worker_id)  # its own task and engine: never slows commits
        webhooks.start()
        try:
            yield
        finally:
            await webhooks.stop()
            # Awaited before the engine is disposed: a sweep cut off mid-query must finish unwinding on a
            # live connection pool, or its task waits forever on a driver thread that is gone.
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sweeper
            await supervisor.stop()
            await notifier.close()
            await db.dispose()

    return Starlette(
        routes=[*compaction_routes, *conversation_routes, *container_routes, *routes, *websocket_routes],
        lifespan=lifespan,
        middleware=[
            Middleware(RequestContextMiddleware, routes=routes),
            Middleware(UnexpectedErrorMiddleware),
            Middleware(AuthMiddleware),
            Middleware(RateLimitMiddleware),
        ],
        exception_handlers={ApiError: _api_error, HTTPException: _http_error},
    )


async def begin_drain(app: Starlette) -> None:
    """SIGTERM: end SSE tails cleanly and hand runs back at once, before connections are closed."""
    state = app.state
    if not hasattr(state, "draining") or state.draining.is_set():
        return
    state.draining.set()
    state.notifier.wake_all()
    await state.supervisor.stop()


async def _api_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    headers = {"Allow": ", ".join(exc.allow)} if isinstance(exc, MethodNotAllowed) else getattr(exc, "headers", None)
    return JSONResponse(exc.body(), status_code=exc.status_code, headers=headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 and 405 (no route, or a route without this method), in OpenAI's error shape."""
    assert isinstance(exc, HTTPException)
    endpoint = f"{request.method} {request.url.path}"
    if exc.status_code == 404:
        return JSONResponse(NotFound(f"Unknown endpoint: {endpoint}. This server has no such route.").body(), 404)
    if exc.status_code == 405:
        allow = (exc.headers or {}).get("Allow", "")
        error = MethodNotAllowed(
            f"Method {request.method} is not allowed on {request.url.path}; allowed: {allow}.", allow=allow.split(", ")
        )
        return await _api_error(request, error)
    body: dict[str, Any] = {
        "error": {"message": str(exc.detail), "type": "invalid_request_error", "param": None, "code": None}
    }
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


class UnexpectedErrorMiddleware:
    """A bug answers 500 in OpenAI's error shape and keeps the keep-alive connection usable
    (Starlette's own handler re-raises, and the server then drops the connection)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:
            if started:
                raise  # a stream already under way: ending the connection is the only signal left
            if is_transient(exc):
                log.warning("store unavailable: %s", exc)
                unavailable = StoreUnavailable("The event store is unavailable; retry shortly.")
                reply = JSONResponse(unavailable.body(), status_code=503, headers={"Retry-After": "1"})
            else:
                log.exception("unhandled error", exc_info=exc)
                error = ServerError("The server had an error while processing your request.")
                reply = JSONResponse(error.body(), status_code=500)
            await reply(scope, receive, send)
