"""Archiving a finished response's stream: its events are replaced by one compressed token record.

Every event of a finished run but its first (`response.created`) and its terminal one is a pure
function of the request fact and the sampled tokens: replaying the tokens through a fresh parser and
StreamBuilder (as resume does), then closing the run the way its terminal event says it ended,
regenerates them. After the replay window, `archive_streams` checks that this regeneration gives back
every stored event byte for byte, and only then, in one transaction, deletes those event rows and
replaces the run's `tokens` facts by one `token_record` fact (the same facts, zlib-compressed). A
response whose events do not all regenerate (a tool loop, a format change) is left as it is.

Readers see no difference: `read_events` below fills the gaps of an archived response from the
record, so `GET …?stream=true` (with or without `starting_after`) streams the same bytes as before.
The log of an archived response keeps its `response.created` and terminal rows, so SQL readers,
projections and `rebuild-projections` (which fold the terminal snapshot) are unchanged.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.log.facts import RequestFact, TokensFact, decode_as
from service.prompting.base import ChatFormat, ItemEnded, MalformedOutput
from service.protocol import TERMINAL_EVENT_TYPES
from service.runs.state import replay_run
from service.store import event_log
from service.store.event_log import StoredEvent
from service.store.schema import events, responses, run_facts, runs
from service.store.token_facts import RECORD_KIND, merge_token_facts
from service.stream_builder import Ending

log = logging.getLogger(__name__)

# A finished response whose events do not all regenerate: never looked at again.
SKIPPED_KIND = "not_compactable"


def encode_record(token_facts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The `token_record` fact holding these `tokens` facts (merged, zlib-compressed, base64)."""
    raw = event_log.encode(merge_token_facts(token_facts)).encode()
    return {"zlib": base64.b64encode(zlib.compress(raw, 9)).decode()}


def decode_record(data: dict[str, Any]) -> dict[str, Any]:
    """The one `tokens` fact a `token_record` holds."""
    merged: dict[str, Any] = json.loads(zlib.decompress(base64.b64decode(data["zlib"])))
    return merged


def _ending(terminal: dict[str, Any]) -> tuple[Ending, dict[str, str] | None]:
    response = terminal["response"]
    status = response["status"]
    if status == "completed":
        return "stop", None
    if status == "cancelled":
        return "cancelled", None
    if status == "failed":
        return "failed", response.get("error")
    return "length", None


def regenerate(
    response_id: str,
    request_fact: dict[str, Any],
    token_facts: Sequence[dict[str, Any]],
    terminal: dict[str, Any],
    chat_format: ChatFormat,
) -> list[dict[str, Any]]:
    """Every event of the finished response, regenerated from its request, tokens and terminal event (pure)."""
    tokens = [decode_as(TokensFact, fact) for fact in token_facts]
    run = replay_run(response_id, decode_as(RequestFact, request_fact), tokens, [], chat_format, None)
    events = run.pending
    ending, error = _ending(terminal)
    try:
        chunks = run.parser.finish()
    except MalformedOutput:
        chunks = []
    if ending != "stop":
        chunks = [chunk for chunk in chunks if not isinstance(chunk, ItemEnded)]
    usage = terminal["response"].get("usage") or {}
    events += run.builder.feed(chunks)
    events += run.builder.finish(
        ending,
        input_tokens=usage.get("input_tokens", run.prompt_tokens),
        output_tokens=usage.get("output_tokens", run.generated),
        error=error,
        completed_at=terminal["response"].get("completed_at"),
    )
    return events


async def _load(connection: AsyncConnection, response_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """(request fact, token facts) of a response, from its record or its `tokens` facts."""
    facts = await event_log.read_facts(connection, response_id)
    request = next((f.data for f in facts if f.kind == "request"), None)
    if request is None:
        return None
    record = next((f.data for f in facts if f.kind == RECORD_KIND), None)
    tokens = [decode_record(record)] if record is not None else [f.data for f in facts if f.kind == "tokens"]
    return request, tokens


class StreamReader:
    """`event_log.read_events` for streaming clients, with the gaps of archived responses filled in."""

    def __init__(self, chat_format: ChatFormat, cache_size: int = 64) -> None:
        self.chat_format = chat_format
        self._cache: OrderedDict[str, list[StoredEvent]] = OrderedDict()
        self._cache_size = cache_size

    async def read_events(
        self, connection: AsyncConnection, response_id: str, *, after: int = -1, limit: int | None = None
    ) -> list[StoredEvent]:
        batch = await event_log.read_events(connection, response_id, after=after, limit=limit)
        if all(stored.sequence_number == after + 1 + index for index, stored in enumerate(batch)):
            return batch  # no gap (or a gap only an uncommitted event explains: the tail waits for it)
        full = await self._regenerated(connection, response_id)
        if full is None:
            return batch
        last = batch[-1].sequence_number
        return [stored for stored in full if after < stored.sequence_number <= last]

    async def _regenerated(self, connection: AsyncConnection, response_id: str) -> list[StoredEvent] | None:
        if response_id in self._cache:
            self._cache.move_to_end(response_id)
            return self._cache[response_id]
        has_record = await connection.scalar(
            sa.select(sa.func.count())
            .select_from(run_facts)
            .where(run_facts.c.response_id == response_id, run_facts.c.kind == RECORD_KIND)
        )
        loaded = await _load(connection, response_id) if has_record else None
        if loaded is None:
            return None
        kept = await event_log.read_events(connection, response_id)
        if not kept or kept[-1].type not in TERMINAL_EVENT_TYPES:
            return None
        events = await asyncio.to_thread(
            regenerate, response_id, loaded[0], loaded[1], kept[-1].payload(), self.chat_format
        )
        full = [StoredEvent(0, response_id, e["sequence_number"], e["type"], event_log.encode(e)) for e in events]
        self._cache[response_id] = full
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return full


async def archive_streams(
    db: AsyncEngine,
    chat_format: ChatFormat,
    *,
    window_seconds: float,
    batch_size: int = 20,
    now: float | None = None,
) -> int:
    """Archive up to `batch_size` finished responses older than the replay window; returns how many were
    looked at (archived or found not regenerable). Each is checked on a read snapshot, then rewritten in
    one short transaction that re-checks nothing changed meanwhile."""
    cutoff = (time.time() if now is None else now) - window_seconds
    recorded = sa.select(run_facts.c.response_id).where(run_facts.c.kind.in_([RECORD_KIND, SKIPPED_KIND]))
    tokens = sa.select(run_facts.c.response_id).where(run_facts.c.kind == "tokens")
    query = (
        sa.select(runs.c.response_id)
        .join(responses, responses.c.id == runs.c.response_id)
        .where(
            runs.c.done.is_(True),
            responses.c.created_at < cutoff,
            runs.c.response_id.in_(tokens),
            runs.c.response_id.not_in(recorded),
        )
        .order_by(responses.c.created_at)
        .limit(batch_size)
    )
    async with db.connect() as connection:
        ids = list((await connection.scalars(query)).all())
    for response_id in ids:
        await _archive_one(db, chat_format, response_id)
    return len(ids)


def _verified(
    response_id: str,
    loaded: tuple[dict[str, Any], list[dict[str, Any]]],
    stored: list[StoredEvent],
    chat_format: ChatFormat,
) -> bool:
    """Whether regeneration gives back every stored event byte for byte (CPU only)."""
    try:
        replayed = regenerate(response_id, loaded[0], loaded[1], stored[-1].payload(), chat_format)
    except Exception:  # noqa: BLE001 - not regenerable: keep the events as they are
        return False
    regenerated = [event_log.encode(e) for e in replayed]
    return len(regenerated) == len(stored) and all(a == b.data for a, b in zip(regenerated, stored, strict=True))


async def _archive_one(db: AsyncEngine, chat_format: ChatFormat, response_id: str) -> int:
    # Read and regenerate outside any write transaction (in a thread: a long stream is CPU work), so
    # writers never wait for it; the rewrite then checks the log is still what was verified.
    async with db.connect() as connection:
        loaded = await _load(connection, response_id)
        stored = await event_log.read_events(connection, response_id)
    if loaded is None or len(stored) < 3 or stored[-1].type not in TERMINAL_EVENT_TYPES:
        return 0
    verified = await asyncio.to_thread(_verified, response_id, loaded, stored, chat_format)
    async with db.begin() as connection:
        await event_log.lock_for_append(connection)
        snapshot = (len(stored), stored[-1].position)
        now = await connection.execute(
            sa.select(sa.func.count(), sa.func.max(events.c.position)).where(events.c.response_id == response_id)
        )
        if tuple(now.one()) != snapshot:
            return 0  # deleted or archived meanwhile
        if not verified:
            log.info("the stream of %s does not regenerate from its tokens; it is kept as it is", response_id)
            await event_log.append_fact(connection, response_id, SKIPPED_KIND, {})
            return 0
        await connection.execute(
            sa.delete(events).where(
                events.c.response_id == response_id,
                events.c.sequence_number > stored[0].sequence_number,
                events.c.sequence_number < stored[-1].sequence_number,
            )
        )
        await connection.execute(
            sa.delete(run_facts).where(run_facts.c.response_id == response_id, run_facts.c.kind == "tokens")
        )
        await connection.execute(
            sa.insert(run_facts).values(
                response_id=response_id,
                kind=RECORD_KIND,
                data=event_log.encode(encode_record(loaded[1])),
                created_at=datetime.now(UTC),
            )
        )
    return 1
