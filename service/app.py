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
from starlette.types import ASGIApp, Receive, Scope, Send

from service.commands import Commands
from service.config import Settings
from service.errors import ApiError, NotFound, ServerError, StoreUnavailable, Unauthorized
from service.http.routes import routes
from service.model_runtime import ModelRuntime
from service.models import load_runtime
from service.notify import Notifier
from service.runs import RunSupervisor
from service.store.db import create_engine, is_sqlite, migrate
from service.store.faults import is_transient

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
        supervisor = RunSupervisor(db, model, notifier, settings)
        state = app.state
        state.settings, state.db, state.runtime, state.notifier = settings, db, model, notifier
        state.supervisor, state.started_at, state.background_tasks = supervisor, time.time(), set()
        state.draining = asyncio.Event()
        state.commands = Commands(db, model, supervisor, notifier, settings)
        await supervisor.start()
        try:
            yield
        finally:
            await supervisor.stop()
            await notifier.close()
            await db.dispose()

    return Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[Middleware(ApiKeyMiddleware, api_key=settings.api_key)],
        exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _unexpected_error},
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
    return JSONResponse(exc.body(), status_code=exc.status_code)


async def _http_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return JSONResponse(NotFound("Unknown URL.").body(), status_code=404)
    body: dict[str, Any] = {
        "error": {"message": str(exc.detail), "type": "invalid_request_error", "param": None, "code": None}
    }
    return JSONResponse(body, status_code=exc.status_code)


async def _unexpected_error(_request: Request, exc: Exception) -> Response:
    if is_transient(exc):
        log.warning("store unavailable: %s", exc)
        unavailable = StoreUnavailable("The event store is unavailable; retry shortly.")
        return JSONResponse(unavailable.body(), status_code=503, headers={"Retry-After": "1"})
    log.exception("unhandled error", exc_info=exc)
    error = ServerError("The server had an error while processing your request.")
    return JSONResponse(error.body(), status_code=500)


class ApiKeyMiddleware:
    """Bearer-token check when SERVICE_API_KEY is set (the openai client sends it)."""

    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.api_key and scope["type"] == "http" and scope["path"].startswith("/v1/"):
            headers = dict(scope["headers"])
            if headers.get(b"authorization", b"").decode() != f"Bearer {self.api_key}":
                response = JSONResponse(Unauthorized().body(), status_code=401)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
