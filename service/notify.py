""" "The log grew" signals. In-process waiters are woken directly after a commit; on
PostgreSQL, LISTEN/NOTIFY carries the same signal to other replicas. Readers always
re-read the log after a wake-up (and poll on a timeout), so a lost signal costs
latency, never correctness."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger(__name__)

CHANNEL = "service_log"


class Notifier:
    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._listeners: list[Callable[[list[str]], None]] = []
        self._pg_connection: Any = None

    def publish_local(self, response_ids: Iterable[str]) -> None:
        ids = list(response_ids)
        for response_id in ids:
            for waiter in self._waiters.get(response_id, ()):
                waiter.set()
        for listener in self._listeners:
            listener(ids)

    def wake_all(self) -> None:
        """Wake every waiter (shutdown: SSE tails re-check and end)."""
        for waiters in self._waiters.values():
            for waiter in waiters:
                waiter.set()

    def add_listener(self, listener: Callable[[list[str]], None]) -> None:
        """Called with the ids of every batch (used by the run supervisor to see cancels and new runs)."""
        self._listeners.append(listener)

    async def publish(self, response_ids: Iterable[str]) -> None:
        ids = list(response_ids)
        self.publish_local(ids)
        if self._pg_connection is not None and ids:
            with contextlib.suppress(Exception):  # a replica missing a signal falls back to polling
                await self._pg_connection.execute("SELECT pg_notify($1, $2)", CHANNEL, ",".join(ids)[:7900])

    async def wait(self, response_id: str, timeout: float) -> None:
        """Return when the response's log may have grown, or after `timeout` seconds."""
        waiter = asyncio.Event()
        self._waiters[response_id].add(waiter)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter.wait(), timeout)
        finally:
            waiters = self._waiters.get(response_id)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[response_id]

    async def start_postgres(self, dsn: str) -> None:
        """LISTEN for other replicas' commits (asyncpg DSN, no SQLAlchemy driver suffix)."""
        import asyncpg  # only on PostgreSQL

        try:
            self._pg_connection = await asyncpg.connect(dsn)
            await self._pg_connection.add_listener(CHANNEL, self._on_pg_notify)
        except Exception:  # noqa: BLE001 - polling still works without it
            log.warning("LISTEN/NOTIFY unavailable; SSE tailing falls back to polling", exc_info=True)
            self._pg_connection = None

    def _on_pg_notify(self, _connection: Any, _pid: int, _channel: str, payload: str) -> None:
        self.publish_local(payload.split(","))

    async def close(self) -> None:
        if self._pg_connection is not None:
            with contextlib.suppress(Exception):
                await self._pg_connection.close()
            self._pg_connection = None
