"""The event-log contract, one suite run against SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from service.protocol import derived_id
from service.store import event_log, token_facts
from service.store.db import create_engine


def _events(first: int, count: int) -> list[dict[str, object]]:
    return [
        {"type": "response.output_text.delta", "sequence_number": n, "delta": f"t{n}"}
        for n in range(first, first + count)
    ]


async def _append(db: AsyncEngine, response_id: str, events: list[dict[str, object]]) -> int:
    async with db.begin() as connection:
        await event_log.lock_for_append(connection)
        return await event_log.append_events(connection, response_id, events)


async def test_append_then_read_after(db: AsyncEngine) -> None:
    await _append(db, "resp_a", _events(0, 3))
    await _append(db, "resp_b", _events(0, 2))
    await _append(db, "resp_a", _events(3, 2))
    async with db.connect() as connection:
        everything = await event_log.read_events(connection, "resp_a")
        tail = await event_log.read_events(connection, "resp_a", after=2)
        last = await event_log.last_sequence_number(connection, "resp_a")
        missing = await event_log.last_sequence_number(connection, "resp_missing")
    assert [e.sequence_number for e in everything] == [0, 1, 2, 3, 4]
    assert [e.payload()["delta"] for e in tail] == ["t3", "t4"]
    assert last == 4 and missing == -1
    # data is the event JSON exactly as a client receives it
    assert everything[0].data == '{"type":"response.output_text.delta","sequence_number":0,"delta":"t0"}'
    positions = [e.position for e in everything]
    assert positions == sorted(positions)


async def test_duplicate_sequence_number_fails_and_writes_nothing(db: AsyncEngine) -> None:
    await _append(db, "resp_a", _events(0, 3))
    with pytest.raises(event_log.SequenceConflict):
        # 3 is new but 2 is taken: the whole transaction must roll back
        await _append(db, "resp_a", _events(2, 2))
    async with db.connect() as connection:
        assert [e.sequence_number for e in await event_log.read_events(connection, "resp_a")] == [0, 1, 2]


async def test_concurrent_appenders_exactly_one_wins_each_sequence_number(db: AsyncEngine, database_url: str) -> None:
    writers = [create_engine(database_url) for _ in range(4)]
    try:

        async def contend(writer: AsyncEngine, tag: str) -> list[int]:
            won = []
            for n in range(10):
                event = {"type": "response.output_text.delta", "sequence_number": n, "delta": tag}
                try:
                    await _append(writer, "resp_race", [event])
                    won.append(n)
                except event_log.SequenceConflict:
                    pass
            return won

        results = await asyncio.gather(*(contend(w, f"writer{i}") for i, w in enumerate(writers)))
    finally:
        for writer in writers:
            await writer.dispose()
    wins = sorted(n for won in results for n in won)
    assert wins == list(range(10)), "every sequence number is won exactly once"
    async with db.connect() as connection:
        stored = await event_log.read_events(connection, "resp_race")
    assert [e.sequence_number for e in stored] == list(range(10))


async def test_tailing_by_position_never_skips_a_late_commit(db: AsyncEngine, database_url: str) -> None:
    """A slow transaction that took its position first must not be overtaken by a later one."""
    slow_writer, fast_writer = create_engine(database_url), create_engine(database_url)
    seen: list[int] = []
    stop = asyncio.Event()

    async def reader() -> None:
        last = 0
        while not stop.is_set():
            async with db.connect() as connection:
                batch = await event_log.read_all_events(connection, after_position=last)
            for stored in batch:
                seen.append(stored.position)
                last = stored.position
            await asyncio.sleep(0.01)

    async def slow() -> None:
        async with slow_writer.begin() as connection:
            await event_log.lock_for_append(connection)
            await event_log.append_events(connection, "resp_slow", _events(0, 1))
            await asyncio.sleep(0.5)  # position taken, commit delayed

    async def fast() -> None:
        await asyncio.sleep(0.1)
        await _append(fast_writer, "resp_fast", _events(0, 1))

    try:
        tail = asyncio.create_task(reader())
        await asyncio.gather(slow(), fast())
        await asyncio.sleep(0.2)
        stop.set()
        await tail
    finally:
        await slow_writer.dispose()
        await fast_writer.dispose()
    async with db.connect() as connection:
        final = [e.position for e in await event_log.read_all_events(connection)]
    assert seen == final, f"reader saw {seen}, log holds {final}"


async def test_facts_are_kept_per_response_in_order(db: AsyncEngine) -> None:
    async with db.begin() as connection:
        await event_log.append_fact(connection, "resp_a", "request", {"x": 1})
        await event_log.append_facts(
            connection,
            [
                ("resp_a", "tokens", {"ids": [5]}),
                ("resp_b", "tokens", {"ids": [7]}),
                ("resp_a", "tokens", {"ids": [6]}),
            ],
        )
    async with db.connect() as connection:
        facts = await event_log.read_facts(connection, "resp_a")
    # A run's token ids go into its current chunk: one `tokens` fact, not one per step.
    assert [(f.kind, f.data) for f in facts] == [("request", {"x": 1}), ("tokens", {"ids": [5, 6]})]


async def test_several_responses_logs_are_read_together_as_each_alone(db: AsyncEngine) -> None:
    """read_logs (runs claimed together): per response, the facts and events read_facts and read_events give."""
    await _append(db, "resp_a", _events(0, 2))
    await _append(db, "resp_b", _events(0, 3))
    await _append(db, "resp_a", _events(2, 2))
    async with db.begin() as connection:
        await event_log.append_fact(connection, "resp_b", "request", {"b": 1})
        await event_log.append_fact(connection, "resp_a", "request", {"a": 1})
        await event_log.append_facts(connection, [("resp_a", "tokens", {"ids": [1, 2]}), ("resp_b", "cancel", {})])
    async with db.connect() as connection:
        together = await event_log.read_logs(connection, ["resp_b", "resp_a", "resp_none"])
        alone = {
            rid: (await event_log.read_facts(connection, rid), await event_log.read_events(connection, rid))
            for rid in ["resp_a", "resp_b", "resp_none"]
        }
    assert together == alone
    assert [e.sequence_number for e in together["resp_a"][1]] == [0, 1, 2, 3]
    assert [f.kind for f in together["resp_b"][0]] == ["request", "cancel"]
    assert together["resp_none"] == ([], [])
    async with db.connect() as connection:
        assert await event_log.read_logs(connection, []) == {}


async def test_token_chunks_roll_over_and_keep_their_order(db: AsyncEngine) -> None:
    steps = 2 * token_facts.CHUNK_CHARS // 6  # ~6 characters per id: about two chunks' worth
    for step in range(steps):
        async with db.begin() as connection:
            await event_log.append_facts(connection, [("resp_a", "tokens", {"ids": [100_000 + step]})])
    async with db.connect() as connection:
        facts = await event_log.read_facts(connection, "resp_a")
        counted = await event_log.count_tokens(connection, ["resp_a", "resp_none"])
    assert 2 <= len(facts) <= 4
    assert all(len(event_log.encode(f.data)) <= token_facts.CHUNK_CHARS + 8 for f in facts)
    assert [t for f in facts for t in f.data["ids"]] == [100_000 + step for step in range(steps)]
    assert counted == {"resp_a": steps, "resp_none": 0}


async def test_deltas_are_stored_compact_and_read_as_sent(db: AsyncEngine) -> None:
    rid = "resp_" + "cd" * 24
    delta = {
        "type": "response.output_text.delta",
        "sequence_number": 0,
        "item_id": derived_id("msg", rid, "output:0"),
        "output_index": 0,
        "content_index": 0,
        "delta": "Hi",
        "logprobs": [],
    }
    async with db.begin() as connection:
        await event_log.append_events(connection, rid, [delta])
    async with db.connect() as connection:
        stored = (await connection.execute(sa.text("SELECT data FROM events"))).scalar_one()
        (read,) = await event_log.read_events(connection, rid)
        last = await event_log.last_event(connection, rid)
        (all_read,) = await event_log.read_all_events(connection)
    assert stored == '[0,"Hi"]'
    assert last is not None
    assert read.data == last.data == all_read.data == event_log.encode(delta)


async def test_a_stream_gets_the_events_that_arrived_together_as_one_run(db: AsyncEngine) -> None:
    """The SSE route writes each run in one send: a replay is one write per page, not one per event."""
    from service.http.sse import tail_event_batches
    from service.notify import Notifier

    terminal = {"type": "response.completed", "sequence_number": 5, "response": {}}
    await _append(db, "resp_a", _events(0, 5) + [terminal])

    async def runs(after: int) -> list[list[int]]:
        batches = tail_event_batches(db, Notifier(), "resp_a", after=after, poll_interval=0.05)
        return [[e.sequence_number for e in batch] async for batch in batches]

    assert await runs(-1) == [[0, 1, 2, 3, 4, 5]]
    assert await runs(2) == [[3, 4, 5]]
