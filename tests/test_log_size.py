"""Log compaction end to end: after runs end, their `tokens` facts (chunks of ids) are folded into one
per run; the streams a client replays are byte-identical, replay of the facts still reproduces
the logged events, `doctor` passes and `rebuild-projections` gives the same tables. The log
shrinks (bytes of `run_facts` per generated token, measured and printed)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx

from service.log.facts import RequestFact, TokensFact, decode_as
from service.prompting.harmony import HarmonyFormat
from service.runs.state import replay_run
from service.store import event_log
from service.store.db import create_engine
from service.store.token_facts import merge_token_facts
from tests.api_helpers import client_for, sql_rows
from tests.conftest import ServerProcess
from tests.faults import assert_doctor_clean_and_projections_rebuild

ServerFactory = Callable[..., ServerProcess]


def _read_events(database_url: str, response_id: str) -> list[event_log.StoredEvent]:
    async def run() -> list[event_log.StoredEvent]:
        db = create_engine(database_url)
        try:
            async with db.connect() as connection:
                return await event_log.read_events(connection, response_id)
        finally:
            await db.dispose()

    return asyncio.run(run())


def _stream_bytes(url: str, response_id: str, after: int = -1) -> bytes:
    with httpx.stream(
        "GET", f"{url}/v1/responses/{response_id}", params={"stream": "true", "starting_after": after}, timeout=120
    ) as stream:
        return stream.read()


def test_merge_token_facts_concatenates_ids_and_logprobs() -> None:
    facts = [{"ids": [1], "logprobs": [{"a": 1}]}, {"ids": [2, 3], "logprobs": [{"b": 2}, {"c": 3}]}]
    assert merge_token_facts(facts) == {"ids": [1, 2, 3], "logprobs": [{"a": 1}, {"b": 2}, {"c": 3}]}
    assert merge_token_facts([{"ids": [5]}, {"ids": [6]}]) == {"ids": [5, 6]}


def test_finished_runs_keep_one_tokens_fact_and_replay_identically(
    database_url: str, app_factory: ServerFactory
) -> None:
    server = app_factory(database_url, SERVICE_LOG_COMPACTION_GRACE_SECONDS="3600").start()
    client = client_for(server.url)
    ids = [
        client.responses.create(input=f"Tell me a story {n}", max_output_tokens=40, extra_body={"seed": n}).id
        for n in range(3)
    ]
    with_logprobs = client.responses.create(
        input="Count", max_output_tokens=12, include=["message.output_text.logprobs"], top_logprobs=2
    )
    ids.append(with_logprobs.id)
    streams = {rid: _stream_bytes(server.url, rid) for rid in ids}
    tails = {rid: _stream_bytes(server.url, rid, after=5) for rid in ids}
    responses = {rid: client.responses.retrieve(rid).model_dump() for rid in ids}
    server.stop()
    facts_sql = "SELECT COUNT(*), COALESCE(SUM(LENGTH(data)), 0) FROM run_facts WHERE kind = 'tokens'"
    ((rows_before, bytes_before),) = sql_rows(database_url, facts_sql)
    generated = sum(r["usage"]["output_tokens"] for r in responses.values())
    assert len(ids) <= rows_before < generated  # a few chunks per run while live, not one per token

    server = app_factory(
        database_url, SERVICE_LOG_COMPACTION_GRACE_SECONDS="0", SERVICE_RETENTION_SWEEP_SECONDS="0.2"
    ).start()
    deadline = time.monotonic() + 60
    while sql_rows(database_url, facts_sql)[0][0] != len(ids) and time.monotonic() < deadline:
        time.sleep(0.2)
    ((rows_after, bytes_after),) = sql_rows(database_url, facts_sql)
    assert rows_after == len(ids)
    print(
        f"tokens facts: {rows_before} rows, {bytes_before / generated:.1f} data bytes/token -> "
        f"{rows_after} rows, {bytes_after / generated:.1f} data bytes/token"
    )
    client = client_for(server.url)
    for rid in ids:
        assert _stream_bytes(server.url, rid) == streams[rid]
        assert _stream_bytes(server.url, rid, after=5) == tails[rid]
        assert client.responses.retrieve(rid).model_dump() == responses[rid]
    server.stop()

    # Replaying the one compacted fact regenerates exactly the logged events (as resume does).
    fmt = HarmonyFormat()
    for rid in ids:
        by_position = "SELECT kind, data FROM run_facts WHERE response_id = :r ORDER BY position"
        facts = sql_rows(database_url, by_position, r=rid)
        request = decode_as(RequestFact, next(data for kind, data in facts if kind == "request"))
        tokens = [decode_as(TokensFact, data) for kind, data in facts if kind == "tokens"]
        logged = [e.payload() for e in _read_events(database_url, rid)]
        # Everything the tokens produce (all but the events the run's end adds) is logged, event for event.
        regenerated = replay_run(rid, request, tokens, [], fmt, None).pending
        assert regenerated == logged[: len(regenerated)]
        assert sum(e["type"].endswith(".delta") for e in regenerated) == sum(
            e["type"].endswith(".delta") for e in logged
        )

    assert_doctor_clean_and_projections_rebuild(database_url)
