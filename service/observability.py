"""What an operator sees: Prometheus metrics, JSON log lines, request ids.

Metrics are updated at the edges only (the HTTP middleware, the supervisor's group commit and
engine step, the commands' appends), never in pure code. With several worker processes set
`PROMETHEUS_MULTIPROC_DIR` (prometheus-client's multiprocess mode); `/metrics` then merges them.

Log lines are one JSON object each: time, level, logger, message, and the request id, response id
and project of the request being served (context variables). Keys are never logged; prompts and
outputs neither (the service logs none)."""

from __future__ import annotations

import contextvars
import json
import logging
import os
import re
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client import REGISTRY as DEFAULT_REGISTRY
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

T = TypeVar("T")

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
response_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("response_id", default=None)
project_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("project", default=None)

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

HTTP_REQUESTS = Counter("service_http_requests", "HTTP requests by route and status", ["method", "route", "status"])
HTTP_SECONDS = Histogram(
    "service_http_request_duration_seconds", "Time to the response's headers", ["route"], buckets=_LATENCY_BUCKETS
)
TOKENS = Counter("service_tokens_generated", "Tokens sampled and committed to the log")
TIME_TO_FIRST_TOKEN = Histogram(
    "service_time_to_first_token_seconds",
    "From a run's start on this worker to its first token",
    buckets=_LATENCY_BUCKETS,
)
INTER_TOKEN = Histogram(
    "service_inter_token_latency_seconds", "Between two tokens of one run", buckets=_LATENCY_BUCKETS
)
ENGINE_STEP = Histogram("service_engine_step_seconds", "One engine step of every active run", buckets=_LATENCY_BUCKETS)
GROUP_COMMIT = Histogram(
    "service_group_commit_seconds", "One group commit (every run's step, one transaction)", buckets=_LATENCY_BUCKETS
)
EVENT_APPEND = Histogram(
    "service_event_append_seconds", "A command's append transaction", ["command"], buckets=_LATENCY_BUCKETS
)
LEASE_TAKEOVERS = Counter("service_lease_takeovers", "Runs claimed again after another claim (a worker died)")
STORE_RETRIES = Counter("service_store_retries", "Group commits retried after a transient store fault")
ACTIVE_RUNS = Gauge("service_active_runs", "Runs generating on this worker", multiprocess_mode="livesum")
QUEUED_RUNS = Gauge("service_queued_runs", "Runs waiting for a worker (all replicas)", multiprocess_mode="max")
SSE_SUBSCRIBERS = Gauge("service_sse_subscribers", "Open event streams on this worker", multiprocess_mode="livesum")
PREFIX_CACHE_HITS = Gauge("service_prefix_cache_hits", "Runs that reused cached KV rows", multiprocess_mode="livesum")
PREFIX_CACHE_TOKENS = Gauge(
    "service_prefix_cache_reused_tokens", "Prompt tokens taken from the prefix cache", multiprocess_mode="livesum"
)
PREFIX_CACHE_WARMED = Gauge(
    "service_prefix_cache_warmed_tokens",
    "Tokens an idle engine prefilled into the prefix cache for finished conversations' next turns",
    multiprocess_mode="livesum",
)
PREFILL_PACED_STEPS = Gauge(
    "service_prefill_paced_steps",
    "Engine steps whose prefill was held below the token budget so that decoding runs were not stalled long"
    " (SERVICE_PREFILL_STALL_RATIO)",
    multiprocess_mode="livesum",
)

WEBHOOK_DELIVERIES = Counter(
    "service_webhook_deliveries", "Webhook attempts by outcome (delivered, retry, failed)", ["outcome"]
)
WEBHOOK_ATTEMPT_SECONDS = Histogram(
    "service_webhook_attempt_seconds", "One webhook POST, from send to answer or error", buckets=_LATENCY_BUCKETS
)
WEBHOOK_BACKLOG_AGE = Gauge(
    "service_webhook_backlog_age_seconds",
    "Age of the oldest undelivered webhook (all replicas)",
    multiprocess_mode="max",
)


def timed(histogram: Histogram, function: Callable[[], T]) -> Callable[[], T]:
    """`function`, observing how long each call takes."""

    def call() -> T:
        started = time.perf_counter()
        try:
            return function()
        finally:
            histogram.observe(time.perf_counter() - started)

    return call


def token_count(facts_of_writes: Iterable[list[tuple[str, dict[str, Any]]]]) -> int:
    """Sampled tokens in a group commit's `tokens` facts."""
    return sum(len(data["ids"]) for facts in facts_of_writes for kind, data in facts if kind == "tokens")


class RunClock:
    """Time to first token and inter-token latency, per run, measured by the supervisor."""

    def __init__(self) -> None:
        self._started: dict[str, float] = {}
        self._last: dict[str, float] = {}

    def started(self, response_id: str) -> None:
        self._started[response_id] = time.monotonic()

    def token(self, response_id: str) -> None:
        now = time.monotonic()
        last = self._last.get(response_id)
        if last is not None:
            INTER_TOKEN.observe(now - last)
        elif response_id in self._started:
            TIME_TO_FIRST_TOKEN.observe(now - self._started[response_id])
        self._last[response_id] = now

    def ended(self, response_id: str) -> None:
        self._started.pop(response_id, None)
        self._last.pop(response_id, None)


def metrics_text() -> tuple[bytes, str]:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        collector: Any = multiprocess.MultiProcessCollector  # untyped in prometheus-client
        collector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(DEFAULT_REGISTRY), CONTENT_TYPE_LATEST


async def metrics_endpoint(request: Request) -> Response:
    """Gauges that describe the present are read at scrape time."""
    state = request.app.state
    from service.store import leases

    ACTIVE_RUNS.set(len(state.supervisor.active))
    async with state.db.connect() as connection:
        QUEUED_RUNS.set(max(0, await leases.unfinished_runs(connection) - len(state.supervisor.active)))
    SSE_SUBSCRIBERS.set(state.subscribers.total())
    # This app's engine's figures, 0 where it has no cache or pacer (what a process that never set them reads; the
    # gauges are the process's, and another app in it, a test's, may have set them).
    cache = getattr(state.supervisor.runtime.engine, "prefix_cache", None)
    PREFIX_CACHE_HITS.set(cache.hits if cache is not None else 0)
    PREFIX_CACHE_TOKENS.set(cache.reused_tokens if cache is not None else 0)
    PREFIX_CACHE_WARMED.set(cache.warmed_tokens if cache is not None else 0)
    pacer = getattr(state.supervisor.runtime.engine, "prefill_pacer", None)
    PREFILL_PACED_STEPS.set(pacer.paced_steps if pacer is not None else 0)
    body, content_type = metrics_text()
    return Response(body, media_type=content_type)


# -- request ids, per-request metrics and the access log ---------------------------------------
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
access_log = logging.getLogger("service.access")


def _route_of(routes: Sequence[BaseRoute], scope: Scope) -> str:
    for route in routes:
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return str(getattr(route, "path", "?"))
    return "unmatched"  # never the raw path: label values stay few


class RequestContextMiddleware:
    """Outermost: gives each request an id (the client's `X-Request-Id` when it is sane), echoes
    it, counts the request by route and status, and writes one access log line."""

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        request_id = incoming if _REQUEST_ID.match(incoming) else "req_" + secrets.token_hex(12)
        tokens = (request_id_var.set(request_id), response_id_var.set(None), project_var.set(None))
        route = _route_of(self.routes, scope)
        started = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
                HTTP_SECONDS.labels(route).observe(time.perf_counter() - started)
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            HTTP_REQUESTS.labels(scope["method"], route, str(status)).inc()
            access_log.info(
                "request",
                extra={
                    "method": scope["method"],
                    "route": route,
                    "status": status,
                    "duration_ms": round((time.perf_counter() - started) * 1000, 1),
                },
            )
            for var, token in zip((request_id_var, response_id_var, project_var), tokens, strict=True):
                var.reset(token)


# -- JSON log lines ------------------------------------------------------------------------------
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "color_message"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, var in (("request_id", request_id_var), ("response_id", response_id_var), ("project", project_var)):
            value = var.get()
            if value is not None:
                line[name] = value
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_") and key not in line:
                line[key] = value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure_logging(level: str) -> None:
    """Every logger (uvicorn's included) writes JSON lines to stderr."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
