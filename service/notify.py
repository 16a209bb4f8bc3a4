""" "The log grew" signals. After a commit, in-process waiters are woken and handed the
committed events themselves (so a live tail needs no extra read); on PostgreSQL,
LISTEN/NOTIFY carries the wake-up to other replicas, whose readers then read the log.
A lost signal costs latency (readers poll on a timeout), never correctness."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from service.store.event_log import StoredEvent

log = logging.getLogger(__name__)

CHANNEL = "service_log"


class Subscription:
    """One reader's registration for one response: what commits publish while the reader is busy
    (e.g. sending the previous batch to its client) waits here instead of being missed."""

    def __init__(self) -> None:
        self.woken = asyncio.Event()
        self.events: list[StoredEvent] = []

    async def next(self, timeout: float) -> list[StoredEvent]:
        """Events published since the last call (possibly none: a bare wake-up), waiting up to `timeout`."""
        if not self.woken.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.woken.wait(), timeout)
        self.woken.clear()
        events, self.events = self.events, []
        return events


class Notifier:
    def __init__(self) -> None:
        self._waiters: dict[str, set[Subscription]] = defaultdict(set)
        self._pg_connection: Any = None
        self._dsn = ""
        self._closed = False
        self._reconnecting: asyncio.Task[None] | None = None
        self._own_pid: int | None = None  # the listening session's backend process (see _listen)

    def publish_local(
        self, response_ids: Iterable[str], committed: Mapping[str, Sequence[StoredEvent]] | None = None
    ) -> None:
        for response_id in response_ids:
            for waiter in self._waiters.get(response_id, ()):
                if committed is not None:
                    waiter.events.extend(committed.get(response_id, ()))
                waiter.woken.set()

    def wake_all(self) -> None:
        """Wake every waiter (shutdown: SSE tails re-check and end)."""
        for waiters in self._waiters.values():
            for waiter in waiters:
                waiter.woken.set()

    async def publish(
        self, response_ids: Iterable[str], committed: Mapping[str, Sequence[StoredEvent]] | None = None
    ) -> None:
        """Call only after the commit: waiters may send what they are handed at once."""
        ids = list(response_ids)
        self.publish_local(ids, committed)
        if self._pg_connection is not None and ids:
            with contextlib.suppress(Exception):  # a replica missing a signal falls back to polling
                await self._pg_connection.execute("SELECT pg_notify($1, $2)", CHANNEL, ",".join(ids)[:7900])

    async def wait(self, response_id: str, timeout: float) -> list[StoredEvent]:
        """Return when the response's log may have grown (with the committed events when this
        process wrote them), or after `timeout` seconds with nothing."""
        with self.subscribe(response_id) as subscription:
            return await subscription.next(timeout)

    @contextlib.contextmanager
    def subscribe(self, response_id: str) -> Iterator[Subscription]:
        """Receive every publication for `response_id` while the block runs (a live tail holds one
        for its whole life, so a commit that lands while it is sending is handed over, not missed)."""
        subscription = Subscription()
        self._waiters[response_id].add(subscription)
        try:
            yield subscription
        finally:
            waiters = self._waiters.get(response_id)
            if waiters is not None:
                waiters.discard(subscription)
                if not waiters:
                    del self._waiters[response_id]

    async def start_postgres(self, dsn: str) -> None:
        """LISTEN for other replicas' commits (asyncpg DSN, no SQLAlchemy driver suffix). A lost
        listener connection is re-established in the background; meanwhile tails poll."""
        self._dsn = dsn
        if not await self._listen():
            log.warning("LISTEN/NOTIFY unavailable for now; SSE tailing polls until it connects")
            self._reconnect_soon()

    async def _listen(self) -> bool:
        import asyncpg  # only on PostgreSQL

        try:
            connection = await asyncpg.connect(self._dsn, timeout=5)
            await connection.add_listener(CHANNEL, self._on_pg_notify)
            connection.add_termination_listener(self._on_pg_terminated)
        except Exception:  # noqa: BLE001 - polling still works without it
            return False
        self._pg_connection = connection
        # PostgreSQL hands a session the notifications it sent itself: those are this process's own
        # commits, whose waiters publish() has already handed the events.
        self._own_pid = connection.get_server_pid()
        return True

    def _on_pg_terminated(self, _connection: Any) -> None:
        self._pg_connection = None
        if not self._closed:
            self._reconnect_soon()

    def _reconnect_soon(self) -> None:
        if self._reconnecting is None or self._reconnecting.done():
            self._reconnecting = asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        attempt = 0
        while not self._closed:
            await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
            attempt += 1
            if await self._listen():
                log.warning("LISTEN/NOTIFY reconnected")
                # Signals sent while we were away are lost: every tail re-reads the log now.
                self.wake_all()
                return

    def _on_pg_notify(self, _connection: Any, pid: int, _channel: str, payload: str) -> None:
        if pid == self._own_pid:
            return  # our own publish(): a bare wake-up now would send every tail to read the log again
        self.publish_local(payload.split(","))

    async def close(self) -> None:
        self._closed = True
        if self._reconnecting is not None:
            self._reconnecting.cancel()
        if self._pg_connection is not None:
            with contextlib.suppress(Exception):
                await self._pg_connection.close()
            self._pg_connection = None
