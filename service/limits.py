"""Limits on what one key or project may ask of the server, each an OpenAI-style error.

- requests per minute per key: a token bucket per key, in process (each replica counts its own
  requests: N replicas admit up to N times the rate; put a shared limiter in front for a global one);
- runs per project and queue depth: counted in the `runs` table, so they hold across replicas
  (the count and the insert are not one transaction: a burst may overshoot by a few runs);
- SSE subscribers per response: in process, per replica.

Body size (413), the prompt against the context window and `max_output_tokens` against it (400)
are checked where the body is read and where the prompt is rendered."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import ApiError


class RateLimited(ApiError):
    status_code = 429
    error_type = "rate_limit_error"

    def __init__(self, message: str, *, code: str, retry_after: float, headers: dict[str, str] | None = None) -> None:
        super().__init__(message, code=code)
        self.headers = {"Retry-After": str(max(1, math.ceil(retry_after))), **(headers or {})}


class Overloaded(ApiError):
    status_code = 503
    error_type = "server_error"

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message, code="server_overloaded")
        self.headers = {"Retry-After": str(max(1, math.ceil(retry_after)))}


@dataclass
class _Bucket:
    tokens: float
    updated: float


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    limit: int
    remaining: int
    reset_seconds: float  # until the bucket is full again
    retry_after: float  # until the next request would be allowed

    def headers(self) -> dict[str, str]:
        return {
            "x-ratelimit-limit-requests": str(self.limit),
            "x-ratelimit-remaining-requests": str(self.remaining),
            "x-ratelimit-reset-requests": f"{self.reset_seconds:.3f}s",
        }


class RequestRateLimiter:
    """`per_minute` requests per key, refilled continuously (bursts up to `per_minute`)."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._buckets: dict[str, _Bucket] = {}
        self._now = time.monotonic

    def check(self, key: str) -> RateDecision:
        now = self._now()
        rate = self.per_minute / 60.0
        bucket = self._buckets.setdefault(key, _Bucket(float(self.per_minute), now))
        bucket.tokens = min(float(self.per_minute), bucket.tokens + (now - bucket.updated) * rate)
        bucket.updated = now
        allowed = bucket.tokens >= 1.0
        if allowed:
            bucket.tokens -= 1.0
        reset = (self.per_minute - bucket.tokens) / rate
        if len(self._buckets) > 10_000:  # forget full buckets so the table stays small
            self._buckets = {k: b for k, b in self._buckets.items() if b.tokens < self.per_minute or k == key}
        retry_after = max(0.0, 1.0 - bucket.tokens) / rate
        return RateDecision(allowed, self.per_minute, int(bucket.tokens), reset, retry_after)


def check_runs(*, project_runs: int, project_limit: int, all_runs: int, queue_limit: int) -> None:
    """Raise when a new run would pass the project's concurrency or the server's queue bound."""
    if all_runs >= queue_limit:
        raise Overloaded(
            f"The server has {all_runs} runs queued or generating (limit {queue_limit}); retry shortly.",
            retry_after=2,
        )
    if project_runs >= project_limit:
        raise RateLimited(
            f"This project has {project_runs} runs queued or generating, its limit is {project_limit}; "
            "wait for one to finish.",
            code="too_many_concurrent_runs",
            retry_after=1,
        )


class SubscriberLimit:
    """At most `limit` SSE streams open at once on one response (in this process)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open: dict[str, int] = {}

    @contextlib.contextmanager
    def hold(self, response_id: str) -> Iterator[None]:
        self.acquire(response_id)
        try:
            yield
        finally:
            self.release(response_id)

    def acquire(self, response_id: str) -> None:
        count = self.open.get(response_id, 0)
        if count >= self.limit:
            raise RateLimited(
                f"Response '{response_id}' already has {count} open streams (limit {self.limit}).",
                code="too_many_subscribers",
                retry_after=1,
            )
        self.open[response_id] = count + 1

    def release(self, response_id: str) -> None:
        count = self.open.get(response_id, 0) - 1
        if count <= 0:
            self.open.pop(response_id, None)
        else:
            self.open[response_id] = count

    def total(self) -> int:
        return sum(self.open.values())


class RateLimitMiddleware:
    """Requests per minute per key on `/v1/…` (after authentication; unauthenticated use is not
    limited). Every answer carries OpenAI's `x-ratelimit-*-requests` headers; past the limit, a 429
    with `Retry-After`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key_name = scope.get("state", {}).get("key_name")
        limiter: RequestRateLimiter | None = getattr(scope["app"].state, "rate_limiter", None)
        if scope["type"] != "http" or key_name is None or limiter is None or limiter.per_minute == 0:
            await self.app(scope, receive, send)
            return
        decision = limiter.check(key_name)
        headers = decision.headers()
        if not decision.allowed:
            error = RateLimited(
                f"Rate limit reached: {limiter.per_minute} requests per minute for this key. "
                f"Retry in {decision.retry_after:.1f}s.",
                code="rate_limit_exceeded",
                retry_after=decision.retry_after,
                headers=headers,
            )
            await JSONResponse(error.body(), status_code=429, headers=error.headers)(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = [(name.encode(), value.encode()) for name, value in headers.items()]
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, send_with_headers)
