"""The delivery worker: every replica runs one as its own asyncio task, with its own database engine, and
never takes the append lock, so a slow or dead receiver cannot slow generation or commits.

Rows are claimed with leases, like runs (`store/leases.py`): a due `pending` row whose owner is unset or whose
lease expired is taken in one guarded UPDATE (on PostgreSQL after `SELECT … FOR UPDATE SKIP LOCKED`). The lease
outlasts the POST's whole timeout, so no two workers POST one row at once. A worker killed after its POST and
before recording the result leaves the row `pending`; once the lease expires another worker (or the restarted
one) sends it again with the same `webhook-id`: delivery is at least once, and receivers de-duplicate on it.

Each attempt is one `webhook_attempts` row (status code, latency, error). 2xx marks the row `delivered`; any
other answer, a timeout or a connection error schedules the next attempt after an exponential backoff with
jitter, until SERVICE_WEBHOOK_RETRY_WINDOW_SECONDS after the event, then the row is `failed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from dataclasses import dataclass

import httpx2
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.config import Settings
from service.observability import WEBHOOK_ATTEMPT_SECONDS, WEBHOOK_BACKLOG_AGE, WEBHOOK_DELIVERIES
from service.store.db import create_engine
from service.store.faults import is_transient
from service.store.webhook_tables import DELIVERED, FAILED, PENDING, webhook_attempts, webhook_deliveries
from service.tools.mcp_policy import McpAddressPolicy, McpUrlRefused, guarded_http_client
from service.webhooks import endpoints, signing

log = logging.getLogger(__name__)

CLAIM_BATCH = 64
ERROR_CHARS = 500


@dataclass(frozen=True)
class Claimed:
    id: str
    endpoint_id: str
    payload: str
    attempt: int  # this attempt's number, from 1
    created_at: float


def lease_seconds(timeout_seconds: float) -> float:
    """Long enough that a POST (bounded by the timeout) and its recording end before anyone may claim again."""
    return 2 * timeout_seconds + 5


def backoff(attempt: int, base: float, rng: random.Random | None = None) -> float:
    """Seconds before attempt `attempt + 1`: base·2^(attempt-1), with jitter in [50%, 100%]."""
    delay = base * (2 ** min(attempt - 1, 40))
    return float(delay * (rng or random).uniform(0.5, 1.0))


async def claim(
    connection: AsyncConnection, owner: str, *, lease: float, free: dict[str, int], default_free: int, limit: int
) -> list[Claimed]:
    """Take due rows, at most `free[endpoint]` (else `default_free`) per endpoint, oldest due first."""
    now = time.time()
    claimable = sa.and_(
        webhook_deliveries.c.status == PENDING,
        webhook_deliveries.c.next_attempt_at <= now,
        sa.or_(webhook_deliveries.c.owner.is_(None), webhook_deliveries.c.lease_expires_at < now),
    )
    query = (
        sa.select(webhook_deliveries.c.id, webhook_deliveries.c.endpoint_id)
        .where(claimable)
        .order_by(webhook_deliveries.c.next_attempt_at, webhook_deliveries.c.id)
        .limit(limit)
    )
    if connection.dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    taken_per_endpoint: Counter[str] = Counter()
    picked: list[str] = []
    for delivery_id, endpoint_id in await connection.execute(query):
        if taken_per_endpoint[endpoint_id] < free.get(endpoint_id, default_free):
            taken_per_endpoint[endpoint_id] += 1
            picked.append(delivery_id)
    if not picked:
        return []
    rows = await connection.execute(
        sa.update(webhook_deliveries)
        .where(webhook_deliveries.c.id.in_(picked), claimable)
        .values(owner=owner, lease_expires_at=now + lease, attempts=webhook_deliveries.c.attempts + 1)
        .returning(
            webhook_deliveries.c.id,
            webhook_deliveries.c.endpoint_id,
            webhook_deliveries.c.payload,
            webhook_deliveries.c.attempts,
            webhook_deliveries.c.created_at,
        )
    )
    return [Claimed(str(i), str(e), str(p), int(a), float(c)) for i, e, p, a, c in rows]


async def any_due(connection: AsyncConnection) -> bool:
    now = time.time()
    query = (
        sa.select(webhook_deliveries.c.id)
        .where(
            webhook_deliveries.c.status == PENDING,
            webhook_deliveries.c.next_attempt_at <= now,
            sa.or_(webhook_deliveries.c.owner.is_(None), webhook_deliveries.c.lease_expires_at < now),
        )
        .limit(1)
    )
    return (await connection.scalar(query)) is not None


async def backlog_age(connection: AsyncConnection) -> float:
    oldest = await connection.scalar(
        sa.select(sa.func.min(webhook_deliveries.c.created_at)).where(webhook_deliveries.c.status == PENDING)
    )
    return 0.0 if oldest is None else max(0.0, time.time() - float(oldest))


async def _always() -> bool:
    return True


def address_policy(settings: Settings) -> McpAddressPolicy:
    """The MCP URL policy with private targets always refused (unless SERVICE_WEBHOOK_ALLOWED_HOSTS names the
    host), applied again at connect time to the addresses the name resolves to: no DNS rebinding."""
    return McpAddressPolicy(allowed_hosts=tuple(settings.webhook_hosts()), keys_configured=_always)


class DeliveryWorker:
    """Claims due rows every `webhook_poll_seconds` and POSTs each in its own task."""

    def __init__(self, settings: Settings, owner: str) -> None:
        self.settings = settings
        self.owner = owner
        self.lease = lease_seconds(settings.webhook_timeout_seconds)
        self.in_flight: Counter[str] = Counter()  # per endpoint
        self.tasks: set[asyncio.Task[None]] = set()
        self.db: AsyncEngine | None = None
        self.client: httpx2.AsyncClient | None = None
        self.box: endpoints.SecretBox | None = None
        self.loop_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.loop_task = asyncio.create_task(self.run(), name="webhook-delivery")

    async def stop(self) -> None:
        """Cut in-flight POSTs short: their rows stay `pending` and are sent again once the lease expires."""
        for task in [self.loop_task, *self.tasks]:
            if task is not None:
                task.cancel()
        for task in [self.loop_task, *self.tasks]:
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self.client is not None:
            await self.client.aclose()
        if self.db is not None:
            await self.db.dispose()

    async def run(self) -> None:
        # Its own engine: its connections and SQLite writer are never the ones generation commits through.
        self.db = create_engine(self.settings.database_url, busy_timeout=min(30.0, self.settings.store_outage_seconds))
        self.client = guarded_http_client(address_policy(self.settings), timeout=self.settings.webhook_timeout_seconds)
        while True:
            claimed: list[Claimed] = []
            try:
                if self.box is None:
                    self.box = await endpoints.SecretBox.load(self.db, self.settings.secret_key)
                claimed = await self._claim()
                for row in claimed:
                    self.in_flight[row.endpoint_id] += 1
                    task = asyncio.create_task(self._deliver(row), name=f"webhook-{row.id}")
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
            except Exception as exc:  # noqa: BLE001 - the worker must outlive a store outage
                if not is_transient(exc):
                    log.exception("webhook claim failed")
            if len(claimed) < CLAIM_BATCH:
                await asyncio.sleep(self.settings.webhook_poll_seconds)

    async def _claim(self) -> list[Claimed]:
        assert self.db is not None
        per_endpoint = self.settings.webhook_concurrency_per_endpoint
        free = {endpoint: per_endpoint - busy for endpoint, busy in self.in_flight.items()}
        # Read first: on SQLite a write transaction takes the database's write lock, which the group commit
        # would wait for; an idle poll should cost generation nothing.
        async with self.db.connect() as connection:
            WEBHOOK_BACKLOG_AGE.set(await backlog_age(connection))
            if not await any_due(connection):
                return []
        async with self.db.begin() as connection:
            return await claim(
                connection, self.owner, lease=self.lease, free=free, default_free=per_endpoint, limit=CLAIM_BATCH
            )

    async def _deliver(self, row: Claimed) -> None:
        try:
            status_code, error, latency = await self._post(row)
            await self._record(row, status_code, error, latency)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the lease expires and another attempt follows
            log.warning("webhook delivery %s not recorded: %s", row.id, exc)
        finally:
            self.in_flight[row.endpoint_id] -= 1
            if self.in_flight[row.endpoint_id] <= 0:
                del self.in_flight[row.endpoint_id]

    async def _post(self, row: Claimed) -> tuple[int | None, str | None, float]:
        assert self.db is not None and self.client is not None and self.box is not None
        body = row.payload.encode()
        timeout = self.settings.webhook_timeout_seconds
        started = time.perf_counter()
        status_code: int | None = None
        error: str | None = None
        try:
            # A removed endpoint or a secret that no longer opens is an attempt's error, recorded like any other.
            async with self.db.connect() as connection:
                endpoint, sealed = await endpoints.get(connection, row.endpoint_id)
            secret = self.box.open(endpoint.id, sealed)
            async with asyncio.timeout(timeout):  # the whole exchange (name lookup included), not each read
                # Checked again at every attempt: the name may resolve elsewhere than it did at `add`.
                await asyncio.to_thread(endpoints.check_url, endpoint.url, self.settings.webhook_hosts())
                answer = await self.client.post(
                    endpoint.url, content=body, headers=signing.headers(secret, row.id, body), timeout=timeout
                )
            status_code = answer.status_code
            if not 200 <= status_code < 300:
                error = f"HTTP {status_code}"
        except TimeoutError:
            error = f"timed out after {timeout:g}s"
        except endpoints.EndpointProblem as exc:
            error = str(exc)
        except McpUrlRefused as exc:  # the name resolved to a refused address when connecting
            error = f"refused: {exc}"[:ERROR_CHARS]
        except httpx2.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]
        return status_code, error, time.perf_counter() - started

    async def _record(self, row: Claimed, status_code: int | None, error: str | None, latency: float) -> None:
        assert self.db is not None
        now = time.time()
        WEBHOOK_ATTEMPT_SECONDS.observe(latency)
        if error is None:
            outcome, values = DELIVERED, {"status": DELIVERED, "finished_at": now, "last_error": None}
        else:
            delay = backoff(row.attempt, self.settings.webhook_backoff_base_seconds)
            if now + delay > row.created_at + self.settings.webhook_retry_window_seconds:
                outcome, values = FAILED, {"status": FAILED, "finished_at": now, "last_error": error}
            else:
                outcome, values = "retry", {"next_attempt_at": now + delay, "last_error": error}
        async with self.db.begin() as connection:
            await connection.execute(
                webhook_attempts.insert().values(
                    delivery_id=row.id,
                    attempt=row.attempt,
                    worker=self.owner,
                    started_at=now - latency,
                    latency_seconds=latency,
                    status_code=status_code,
                    error=error,
                )
            )
            await connection.execute(
                sa.update(webhook_deliveries)
                .where(webhook_deliveries.c.id == row.id, webhook_deliveries.c.owner == self.owner)
                .values(owner=None, lease_expires_at=None, **values)
            )
        WEBHOOK_DELIVERIES.labels(outcome=outcome).inc()
        log.log(
            logging.WARNING if outcome == FAILED else logging.INFO,  # giving up is something to see
            "webhook %s attempt %d to %s: %s",
            row.id,
            row.attempt,
            row.endpoint_id,
            outcome if error is None else f"{outcome} ({error})",
            extra={"webhook_id": row.id, "endpoint": row.endpoint_id, "outcome": outcome, "status_code": status_code},
        )


async def send_test(settings: Settings, db: AsyncEngine, endpoint_id: str) -> tuple[int | None, str | None, float]:
    """`webhooks test`: POST one signed sample `response.completed` event now (not through the outbox)."""
    from service.store.webhook_outbox import payload

    async with db.connect() as connection:
        endpoint, sealed = await endpoints.get(connection, endpoint_id)
    secret = (await endpoints.SecretBox.load(db, settings.secret_key)).open(endpoint.id, sealed)
    endpoints.check_url(endpoint.url, settings.webhook_hosts())
    body = payload("evt_test", "response.completed", "resp_test", int(time.time())).encode()
    started = time.perf_counter()
    async with guarded_http_client(address_policy(settings), timeout=settings.webhook_timeout_seconds) as client:
        try:
            async with asyncio.timeout(settings.webhook_timeout_seconds):
                answer = await client.post(
                    endpoint.url, content=body, headers=signing.headers(secret, "msg_test", body)
                )
        except TimeoutError:
            return None, "timed out", time.perf_counter() - started
        except McpUrlRefused as exc:
            return None, f"refused: {exc}", time.perf_counter() - started
        except httpx2.HTTPError as exc:
            return None, f"{type(exc).__name__}: {exc}", time.perf_counter() - started
    ok = 200 <= answer.status_code < 300
    return answer.status_code, None if ok else f"HTTP {answer.status_code}", time.perf_counter() - started
