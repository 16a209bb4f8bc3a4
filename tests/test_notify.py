"""The notifier's subscriptions: a live tail gets every publication, even those made while it was busy."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from service.notify import Notifier
from service.store.event_log import StoredEvent
from tests.conftest import _PG_SKIP_REASON, PG_ADMIN_DSN


def _event(n: int) -> StoredEvent:
    return StoredEvent(0, "resp_1", n, "response.output_text.delta", "{}")


def test_publications_while_busy_are_kept_for_the_next_wait() -> None:
    async def scenario() -> None:
        notifier = Notifier()
        with notifier.subscribe("resp_1") as subscription:
            # Two commits land while the reader is sending (not waiting): neither is lost.
            await notifier.publish(["resp_1"], {"resp_1": [_event(1)]})
            await notifier.publish(["resp_1", "resp_2"], {"resp_1": [_event(2)]})
            assert [e.sequence_number for e in await subscription.next(5)] == [1, 2]
            assert await subscription.next(0.01) == []  # nothing new: a timeout, empty
            await notifier.publish(["resp_1"])  # a bare wake-up (another replica): empty, at once
            assert await asyncio.wait_for(subscription.next(5), 1) == []
        await notifier.publish(["resp_1"], {"resp_1": [_event(3)]})  # after unsubscribing: nobody holds it
        assert not notifier._waiters

    asyncio.run(scenario())


@pytest.mark.skipif(_PG_SKIP_REASON is not None, reason=str(_PG_SKIP_REASON))
def test_on_postgresql_a_process_is_not_woken_again_by_its_own_commits() -> None:
    """PostgreSQL hands the listening session its own NOTIFYs too: a process's own publication must reach its
    tails once, with the events (a second, bare wake-up would send every tail to read the log after every
    commit), while another replica's reaches them as a bare wake-up."""
    dsn = PG_ADMIN_DSN.replace("postgresql+asyncpg://", "postgresql://")

    async def scenario() -> None:
        mine, other = Notifier(), Notifier()
        await mine.start_postgres(dsn)
        await other.start_postgres(dsn)
        try:
            wake_ups: list[bool] = []  # each of mine's local wake-ups: with events or bare
            publish_local = mine.publish_local

            def counting(response_ids: Any, committed: Any = None) -> None:
                wake_ups.append(committed is not None)
                publish_local(response_ids, committed)

            mine.publish_local = counting  # type: ignore[method-assign]
            with mine.subscribe("resp_1") as own_tail, other.subscribe("resp_1") as other_tail:
                await mine.publish(["resp_1"], {"resp_1": [_event(1)]})
                assert [e.sequence_number for e in await own_tail.next(5)] == [1]
                assert await asyncio.wait_for(other_tail.next(5), 4) == []  # the other replica: woken, no events
                await asyncio.sleep(0.3)  # the NOTIFY's way back to `mine` has long been travelled
                assert wake_ups == [True], "woken again, bare, by its own NOTIFY"
                await other.publish(["resp_1"], {"resp_1": [_event(2)]})
                assert await asyncio.wait_for(own_tail.next(5), 4) == []  # another replica's commit: read the log
                assert wake_ups == [True, False]
        finally:
            await mine.close()
            await other.close()

    asyncio.run(scenario())
