"""Archiving whole streams end to end, on SQLite and PostgreSQL: after the replay window a
finished response keeps only `response.created`, its terminal event and one compressed token
record; `GET …?stream=true` (from the start and with `starting_after`) regenerates the bytes the
client saw live; a response whose events do not regenerate is left as it is; `doctor` passes and
`rebuild-projections` gives the same tables. Live, deltas are stored compact and token ids in chunks."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import httpx

from service.prompting.harmony import HarmonyFormat
from service.store import event_log
from service.store.db import create_engine, migrate
from service.stream_archive import StreamReader, decode_record, encode_record
from tests.api_helpers import COMPACT_AT_ONCE, client_for, sql_rows
from tests.conftest import ServerProcess
from tests.faults import assert_doctor_clean_and_projections_rebuild

ServerFactory = Callable[..., ServerProcess]


def _replayed(url: str, response_id: str, after: int = -1) -> bytes:
    params: dict[str, str | int] = {"stream": "true", "starting_after": after}
    with httpx.stream("GET", f"{url}/v1/responses/{response_id}", params=params, timeout=120) as stream:
        return stream.read()


def _live(url: str, body: dict[str, Any]) -> tuple[str, bytes]:
    """Create a streamed response; returns its id and the bytes the client received."""
    with httpx.stream("POST", f"{url}/v1/responses", json={**body, "stream": True}, timeout=120) as stream:
        raw = stream.read()
    first = next(line for line in raw.decode().splitlines() if line.startswith("data: "))
    return json.loads(first[len("data: ") :])["response"]["id"], raw


def test_compacted_streams_replay_byte_identical(database_url: str, app_factory: ServerFactory) -> None:
    server = app_factory(database_url, SERVICE_LOG_COMPACTION_GRACE_SECONDS="3600").start()
    bodies: list[dict[str, Any]] = [
        {"input": "Tell me a story", "max_output_tokens": 60, "seed": 1},
        {"input": "Count", "max_output_tokens": 12, "include": ["message.output_text.logprobs"], "top_logprobs": 2},
        {"input": "Why?", "max_output_tokens": 30, "instructions": "Be brief.", "seed": 3},
        {"input": "Tampered with", "max_output_tokens": 20, "seed": 4},
    ]
    live = dict(_live(server.url, body) for body in bodies)
    ids = list(live)
    tampered = ids.pop()
    client = client_for(server.url)
    retrieved = {rid: client.responses.retrieve(rid).model_dump() for rid in ids}
    # Every run's tokens, the tampered one's too: the counts below are over all four logs (a slow machine
    # commits each step alone, one delta per token, so a bound over three runs' tokens is too tight).
    usage = client.responses.retrieve(tampered).usage
    assert usage is not None
    generated = sum(r["usage"]["output_tokens"] for r in retrieved.values()) + usage.output_tokens
    for rid in ids:
        assert _replayed(server.url, rid) == live[rid]  # replay from the compact live rows
    server.stop()

    ((compact_rows,),) = sql_rows(database_url, "SELECT COUNT(*) FROM events WHERE data LIKE '[%'")
    ((token_rows,),) = sql_rows(database_url, "SELECT COUNT(*) FROM run_facts WHERE kind = 'tokens'")
    ((delta_rows,),) = sql_rows(database_url, "SELECT COUNT(*) FROM events WHERE type LIKE '%.delta'")
    # Deltas are stored as [output_index, delta(, logprobs)]; a delta may carry several tokens (folded).
    assert 0 < delta_rows == compact_rows <= generated
    assert token_rows < generated // 4  # token ids in a few chunks per run, not a row per step
    # Tamper with one stored delta: that response no longer regenerates, so compaction leaves it alone.
    sql_rows(
        database_url,
        "UPDATE events SET data = '[0,\"forged\"]' WHERE response_id = :rid AND sequence_number = "
        "(SELECT MAX(sequence_number) FROM events WHERE response_id = :rid AND data LIKE '[%')",
        rid=tampered,
    )
    ((tampered_events,),) = sql_rows(database_url, "SELECT COUNT(*) FROM events WHERE response_id = :r", r=tampered)

    server = app_factory(database_url, **COMPACT_AT_ONCE).start()
    marked = "SELECT COUNT(*) FROM run_facts WHERE kind IN ('token_record', 'not_compactable')"
    deadline = time.monotonic() + 60
    while sql_rows(database_url, marked)[0][0] < len(ids) + 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    for rid in ids:
        kinds = sql_rows(database_url, "SELECT kind FROM run_facts WHERE response_id = :r ORDER BY position", r=rid)
        assert sorted(kind for (kind,) in kinds) == ["request", "token_record"]
        rows = sql_rows(database_url, "SELECT sequence_number, type FROM events WHERE response_id = :r", r=rid)
        assert len(rows) == 2 and rows[0] == (0, "response.created")
        last = rows[1][0]
        assert _replayed(server.url, rid) == live[rid]
        for after in (0, 4, last // 2, last - 1):
            tail = _replayed(server.url, rid, after=after)
            assert live[rid].endswith(tail) and tail.startswith(b"event: response."), after
        assert client_for(server.url).responses.retrieve(rid).model_dump() == retrieved[rid]
    assert sql_rows(
        database_url, "SELECT kind FROM run_facts WHERE response_id = :r AND kind = 'not_compactable'", r=tampered
    ) == [("not_compactable",)]
    assert sql_rows(database_url, "SELECT COUNT(*) FROM events WHERE response_id = :r", r=tampered) == [
        (tampered_events,)
    ]
    server.stop()

    assert_doctor_clean_and_projections_rebuild(database_url)


def test_token_record_round_trip() -> None:
    facts: list[dict[str, Any]] = [{"ids": [1, 2]}, {"ids": [3], "logprobs": [{"token": "x", "logprob": -1.0}]}]
    record = encode_record(facts)
    assert set(record) == {"zlib"}
    assert decode_record(record) == {"ids": [1, 2, 3], "logprobs": [None, None, {"token": "x", "logprob": -1.0}]}


def test_a_gap_without_a_record_is_left_for_the_tail_to_wait_on(database_url: str) -> None:
    """An uncommitted event (not a compacted stream): the reader returns the rows as they are."""

    async def run() -> list[int]:
        await migrate(database_url)
        db = create_engine(database_url)
        try:
            async with db.begin() as connection:
                rows = [{"type": "response.output_text.delta", "sequence_number": n, "delta": "x"} for n in (0, 1, 3)]
                await event_log.append_events(connection, "resp_gap", rows)
            async with db.connect() as connection:
                batch = await StreamReader(HarmonyFormat()).read_events(connection, "resp_gap", after=-1)
            return [stored.sequence_number for stored in batch]
        finally:
            await db.dispose()

    assert asyncio.run(run()) == [0, 1, 3]
