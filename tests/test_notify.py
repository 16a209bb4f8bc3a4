"""The notifier's subscriptions: a live tail gets every publication, even those made while it was busy."""

from __future__ import annotations

import asyncio

from service.notify import Notifier
from service.store.event_log import StoredEvent


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
