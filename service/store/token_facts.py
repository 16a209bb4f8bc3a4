"""The sampled token ids of a run, as `tokens` facts in `run_facts`.

A run's ids are kept in a few chunk rows rather than one row per engine step: each step's ids
extend the run's last `tokens` fact in the same transaction as the events they produced, until
its JSON passes `CHUNK_CHARS`, and then a new fact starts. Resume, replay, doctor and rebuild read
the concatenation of a run's `tokens` facts in log order, which chunking leaves unchanged, and a
row per step would cost more bytes (response id, index entry, timestamp) than the ids themselves.

The fact itself, its keys and how facts merge, is `TokensFact` (service/log/facts.py); the functions here that
take and return the stored JSON objects (for the recorder's queued writes and the stream archive) go through it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from service.log.facts import TokenRecord, TokensFact, decode_as, encode_json, fact_data
from service.store.schema import run_facts

# A chunk is rewritten by each step that extends it: this bounds the bytes one step rewrites.
CHUNK_CHARS = 1024
# The fact that replaces a compacted response's `tokens` facts and most of its events (service/stream_record.py).
RECORD_KIND = TokenRecord.KIND


def group_sizes(fact: dict[str, Any]) -> list[int]:
    """How the ids of a stored `tokens` fact were grouped when their events were built (pure): see
    `TokensFact.group_sizes`."""
    return decode_as(TokensFact, fact).group_sizes()


def merge_token_facts(facts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One stored `tokens` fact equal, for replay, to the sequence of `facts` (pure): see `TokensFact.merge`."""
    return fact_data(TokensFact.merge([decode_as(TokensFact, fact) for fact in facts]))


def join_last_group(fact: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    """`fact` with the ids of `later` (one step's `tokens` fact) added to its last group (pure)."""
    return fact_data(decode_as(TokensFact, fact).join_last_group(decode_as(TokensFact, later)))


_later = run_facts.alias("later")
# Extend a remembered chunk only while it is exactly what was remembered and still its run's last fact.
# Built once: constructing the statement per run per step cost a third as much as executing it.
_EXTEND = (
    sa.update(run_facts)
    .where(
        run_facts.c.position == sa.bindparam("chunk"),
        run_facts.c.data == sa.bindparam("old"),
        ~sa.exists().where(_later.c.response_id == sa.bindparam("run"), _later.c.position > sa.bindparam("chunk")),
    )
    .values(data=sa.bindparam("new"))
)
# _EXTEND for many runs in one statement that says which rows it changed: asyncpg cannot count an executemany's
# rows, and reading the chunks back to find out cost a second round trip and every chunk's bytes.
_EXTEND_RETURNING = sa.text(
    "UPDATE run_facts AS f SET data = v.new"
    " FROM unnest(CAST(:chunks AS bigint[]), CAST(:olds AS text[]), CAST(:runs AS text[]), CAST(:news AS text[]))"
    " AS v(chunk, old, run, new)"
    " WHERE f.position = v.chunk AND f.data = v.old"
    " AND NOT EXISTS (SELECT 1 FROM run_facts AS later WHERE later.response_id = v.run AND later.position > v.chunk)"
    " RETURNING f.position"
)


@dataclass(frozen=True)
class Chunk:
    """A run's last `tokens` fact as its writer last wrote or read it."""

    position: int
    data: str  # exactly as stored
    payload: dict[str, Any]


class TokenChunks:
    """The last token chunk of each run a writer appends to, kept in memory so that extending it costs one
    guarded UPDATE instead of a read and an UPDATE per run per step. The guard makes a stale entry harmless:
    the UPDATE applies only while the chunk is still exactly what was remembered and still the run's last
    fact, and otherwise the writer falls back to reading the log (as after a restart or a new claim)."""

    def __init__(self) -> None:
        self._chunks: dict[str, Chunk] = {}

    def get(self, response_id: str) -> Chunk | None:
        return self._chunks.get(response_id)

    def remember(self, response_id: str, chunk: Chunk) -> None:
        self._chunks[response_id] = chunk

    def forget(self, response_ids: Iterable[str]) -> None:
        """A run ended, was lost, got another fact, or its commit's outcome is unknown."""
        for response_id in response_ids:
            self._chunks.pop(response_id, None)

    def __len__(self) -> int:
        return len(self._chunks)


async def append_tokens(
    connection: AsyncConnection,
    response_id: str,
    facts: Sequence[dict[str, Any]],
    now: datetime,
    chunks: TokenChunks | None = None,
) -> None:
    """Log one write's `tokens` facts of one run: extend its last chunk, or start a new one.

    Only a chunk that is still the run's last fact is extended: ids sampled after another fact (a tool
    call's `tool_call_started`/`tool_call_result`, a `cancel_requested`) must stay after it in log order,
    since replay feeds each tool result back between the tokens it came between. With `chunks`, the
    remembered last chunk is extended without reading it first (see TokenChunks)."""
    if not facts:
        return
    data = merge_token_facts(facts)
    known = chunks.get(response_id) if chunks is not None else None
    if known is not None and len(known.data) < CHUNK_CHARS:
        payload = merge_token_facts([known.payload, data])
        merged = encode_json(payload)
        result = await connection.execute(
            _EXTEND, {"chunk": known.position, "old": known.data, "run": response_id, "new": merged}
        )
        if result.rowcount == 1:
            assert chunks is not None
            chunks.remember(response_id, Chunk(known.position, merged, payload))
            return
    last = (
        await connection.execute(
            sa.select(run_facts.c.position, run_facts.c.kind, run_facts.c.data)
            .where(run_facts.c.response_id == response_id)
            .order_by(run_facts.c.position.desc())
            .limit(1)
        )
    ).first()
    if last is not None and last.kind == TokensFact.KIND and len(last.data) < CHUNK_CHARS:
        payload = merge_token_facts([json.loads(last.data), data])
        merged = encode_json(payload)
        await connection.execute(sa.update(run_facts).where(run_facts.c.position == last.position).values(data=merged))
        if chunks is not None:
            chunks.remember(response_id, Chunk(last.position, merged, payload))
        return
    encoded = encode_json(data)
    result = await connection.execute(
        sa.insert(run_facts).values(response_id=response_id, kind=TokensFact.KIND, data=encoded, created_at=now)
    )
    if chunks is not None and result.inserted_primary_key is not None:
        chunks.remember(response_id, Chunk(int(result.inserted_primary_key[0]), encoded, data))


async def append_token_groups(
    connection: AsyncConnection,
    groups: Mapping[str, Sequence[dict[str, Any]]],
    now: datetime,
    chunks: TokenChunks | None = None,
) -> None:
    """Log one write's `tokens` facts of many runs (`append_tokens` for each), extending every remembered
    chunk in one statement (PostgreSQL) or one executemany (SQLite): one round trip per group commit, not
    one per run. The guard still decides each row; the rows it refused (a stale memory) go the way of
    `append_tokens` without memory."""
    extends: list[tuple[str, Chunk, Chunk]] = []  # (run, as remembered, as extended)
    for response_id, facts in groups.items():
        known = chunks.get(response_id) if chunks is not None else None
        if known is None or len(known.data) >= CHUNK_CHARS:
            await append_tokens(connection, response_id, facts, now, chunks)
            continue
        payload = merge_token_facts([known.payload, merge_token_facts(facts)])
        extends.append((response_id, known, Chunk(known.position, encode_json(payload), payload)))
    if not extends:
        return
    assert chunks is not None
    applied = await _extend(connection, extends)
    for response_id, _, new in extends:
        if response_id in applied:
            chunks.remember(response_id, new)
        else:
            chunks.forget([response_id])
            await append_tokens(connection, response_id, groups[response_id], now, chunks)


async def _extend(connection: AsyncConnection, extends: Sequence[tuple[str, Chunk, Chunk]]) -> set[str]:
    """Extend the remembered chunks (run, as remembered, as extended) under _EXTEND's guard; the runs whose
    chunk it extended."""
    if connection.dialect.name == "postgresql":
        arrays = {
            "chunks": [old.position for _, old, _ in extends],
            "olds": [old.data for _, old, _ in extends],
            "runs": [rid for rid, _, _ in extends],
            "news": [new.data for _, _, new in extends],
        }
        changed = set((await connection.execute(_EXTEND_RETURNING, arrays)).scalars())
        return {rid for rid, old, _ in extends if old.position in changed}
    rows = [{"chunk": old.position, "old": old.data, "run": rid, "new": new.data} for rid, old, new in extends]
    result = await connection.execute(_EXTEND, rows)
    if len(extends) == 1 or connection.dialect.supports_sane_multi_rowcount:
        if result.rowcount == len(extends):
            return {rid for rid, _, _ in extends}
        if len(extends) == 1:
            return set()
    # Some guard refused, or the driver cannot count an executemany's rows: see what landed.
    landed = await connection.execute(
        sa.select(run_facts.c.position, run_facts.c.data).where(
            run_facts.c.position.in_([old.position for _, old, _ in extends])
        )
    )
    stored = {position: data for position, data in landed}
    return {rid for rid, old, new in extends if stored.get(old.position) == new.data}


async def count_tokens(connection: AsyncConnection, response_ids: Sequence[str]) -> dict[str, int]:
    """How many token ids each run has in the log (how a writer learns whether a commit whose
    outcome it never heard actually landed)."""
    counts = {rid: 0 for rid in response_ids}
    if not response_ids:
        return counts
    rows = await connection.execute(
        sa.select(run_facts.c.response_id, run_facts.c.data).where(
            run_facts.c.response_id.in_(list(response_ids)), run_facts.c.kind == TokensFact.KIND
        )
    )
    for rid, data in rows:
        counts[rid] += len(decode_as(TokensFact, data).ids)
    return counts
