"""Server-sent events from the log: replay after N, then tail live until the terminal event."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from sqlalchemy.ext.asyncio import AsyncEngine

from service.errors import StoreUnavailable
from service.notify import Notifier
from service.protocol import TERMINAL_EVENT_TYPES
from service.store import event_log, read_models
from service.store.event_log import StoredEvent
from service.store.faults import is_transient

# `event_log.read_events`, or a reader that also fills archived streams (stream_archive.StreamReader).
EventReader = Callable[..., Awaitable[list[StoredEvent]]]


async def tail_event_batches(
    db: AsyncEngine,
    notifier: Notifier,
    response_id: str,
    *,
    after: int,
    poll_interval: float,
    draining: asyncio.Event | None = None,
    outage_limit: float = 60.0,
    read: EventReader = event_log.read_events,
) -> AsyncIterator[list[StoredEvent]]:
    """Every event with sequence_number > after, in order, ending with the terminal event
    (or when the response is deleted, or the server is shutting down: the client resumes
    elsewhere with starting_after). Events are read from the log, so a client never sees
    one that is not committed. While the store is unreachable the tail waits; after
    `outage_limit` seconds of it, StoreUnavailable. Events come in the runs that arrived together (a
    replay's page, one commit's events), so that a stream sends each run in one write."""
    last = after
    pushed: list[StoredEvent] = []
    unreachable_since: float | None = None
    quiet = 0  # polls in a row that found nothing new
    # Subscribed before the first read: whatever commits after it is handed over, never missed.
    with notifier.subscribe(response_id) as subscription:
        while draining is None or not draining.is_set():
            # Events handed over by this process's commit are used directly when they continue the
            # stream without a gap; anything else (another replica, a missed wake-up) reads the log.
            fresh = [event for event in pushed if event.sequence_number > last]
            if fresh and fresh[0].sequence_number == last + 1:
                batch = fresh
            else:
                try:
                    async with db.connect() as connection:
                        batch = await read(connection, response_id, after=last, limit=500)
                        if not batch and not await read_models.exists(connection, response_id):
                            return
                except Exception as exc:
                    if not is_transient(exc):
                        raise
                    unreachable_since = unreachable_since or time.monotonic()
                    if time.monotonic() - unreachable_since > outage_limit:
                        raise StoreUnavailable("The event store is unreachable; retry later.") from exc
                    await asyncio.sleep(poll_interval)
                    continue
                unreachable_since = None
            run: list[StoredEvent] = []
            for stored in batch:
                if stored.sequence_number != last + 1 + len(run):
                    break  # a gap: an earlier event is not committed yet; never skip it
                run.append(stored)
                if stored.type in TERMINAL_EVENT_TYPES:
                    break
            if run:
                yield run
                last = run[-1].sequence_number
                if run[-1].type in TERMINAL_EVENT_TYPES:
                    return
            pushed = [event for event in pushed if event.sequence_number > last]
            if not (pushed and pushed[0].sequence_number == last + 1):
                # Waiting for a queued run: each quiet poll waits longer (up to 4x), since local commits
                # are handed over at once and only other replicas' need the poll.
                quiet = 0 if batch else quiet + 1
                pushed += await subscription.next(poll_interval * min(4, 1 + quiet))


# Deltas OpenAI pads with an `obfuscation` field when a stream asks for it.
_DELTA_TYPES = frozenset(
    {
        "response.output_text.delta",
        "response.reasoning_text.delta",
        "response.function_call_arguments.delta",
        "response.custom_tool_call_input.delta",
    }
)


def event_json(stored: StoredEvent, *, obfuscate: bool = False) -> str:
    """The event's JSON as a client receives it (an SSE frame's data, a WebSocket text frame)."""
    return _with_obfuscation(stored.data) if obfuscate and stored.type in _DELTA_TYPES else stored.data


def sse_frame(stored: StoredEvent, *, obfuscate: bool = False) -> bytes:
    data = event_json(stored, obfuscate=obfuscate)
    # U+2028/U+2029 are legal raw in JSON strings but some SSE clients split lines on them.
    data = data.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return f"event: {stored.type}\nid: {stored.sequence_number}\ndata: {data}\n\n".encode()


def _with_obfuscation(data: str) -> str:
    """Random padding that hides the delta's length; sent, never logged (the log stays deterministic)."""
    event = json.loads(data)
    event["obfuscation"] = secrets.token_urlsafe(max(1, 16 - len(event.get("delta", "")) % 16))[:16]
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False)
