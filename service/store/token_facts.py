"""The sampled token ids of a run, as `tokens` facts in `run_facts`.

A run's ids are kept in a few chunk rows rather than one row per engine step: each step's ids
extend the run's last `tokens` fact in the same transaction as the events they produced, until
its JSON passes `CHUNK_CHARS`, and then a new fact starts. Resume, replay, doctor and rebuild read
the concatenation of a run's `tokens` facts in log order, which chunking leaves unchanged, and a
row per step would cost more bytes (response id, index entry, timestamp) than the ids themselves.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from service.store.schema import run_facts

# A chunk is rewritten by each step that extends it: this bounds the bytes one step rewrites.
CHUNK_CHARS = 1024
# The fact that replaces a compacted response's `tokens` facts and most of its events (service/stream_record.py).
RECORD_KIND = "token_record"


def merge_token_facts(facts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One `tokens` fact equal, for replay, to the sequence of `facts` (pure)."""
    ids = [token for fact in facts for token in fact["ids"]]
    merged: dict[str, Any] = {"ids": ids}
    if any("logprobs" in fact for fact in facts):
        merged["logprobs"] = [entry for fact in facts for entry in fact.get("logprobs", [None] * len(fact["ids"]))]
    return merged


def _encode(payload: dict[str, Any]) -> str:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


async def append_tokens(
    connection: AsyncConnection, response_id: str, facts: Sequence[dict[str, Any]], now: datetime
) -> None:
    """Log one write's `tokens` facts of one run: extend its last chunk, or start a new one.

    Only a chunk that is still the run's last fact is extended: ids sampled after another fact (a tool
    call's `tool_call_started`/`tool_call_result`) must stay after it in log order, since replay feeds
    each tool result back between the tokens it came between."""
    if not facts:
        return
    data = merge_token_facts(facts)
    last = (
        await connection.execute(
            sa.select(run_facts.c.position, run_facts.c.kind, run_facts.c.data)
            .where(run_facts.c.response_id == response_id)
            .order_by(run_facts.c.position.desc())
            .limit(1)
        )
    ).first()
    if last is not None and last.kind == "tokens" and len(last.data) < CHUNK_CHARS:
        merged = _encode(merge_token_facts([json.loads(last.data), data]))
        await connection.execute(sa.update(run_facts).where(run_facts.c.position == last.position).values(data=merged))
        return
    await connection.execute(
        sa.insert(run_facts).values(response_id=response_id, kind="tokens", data=_encode(data), created_at=now)
    )


async def count_tokens(connection: AsyncConnection, response_ids: Sequence[str]) -> dict[str, int]:
    """How many token ids each run has in the log (how a writer learns whether a commit whose
    outcome it never heard actually landed)."""
    counts = {rid: 0 for rid in response_ids}
    if not response_ids:
        return counts
    rows = await connection.execute(
        sa.select(run_facts.c.response_id, run_facts.c.data).where(
            run_facts.c.response_id.in_(list(response_ids)), run_facts.c.kind == "tokens"
        )
    )
    for rid, data in rows:
        counts[rid] += len(json.loads(data)["ids"])
    return counts
