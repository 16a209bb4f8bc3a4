"""The writer's memory of each run's last token chunk (token_facts.TokenChunks), on SQLite and PostgreSQL:
what it writes is what a writer reading the log would write, and a stale memory only costs a read."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from service.store import event_log, token_facts
from service.store.token_facts import TokenChunks


async def _step(db: AsyncEngine, rows: list[tuple[str, str, dict[str, object]]], chunks: TokenChunks | None) -> None:
    async with db.begin() as connection:
        await event_log.lock_for_append(connection)
        await event_log.append_facts(connection, rows, chunks)


async def _facts(db: AsyncEngine, response_id: str) -> list[tuple[str, dict[str, object]]]:
    async with db.connect() as connection:
        return [(f.kind, f.data) for f in await event_log.read_facts(connection, response_id)]


async def _chunk_in_log(db: AsyncEngine, response_id: str) -> token_facts.Chunk:
    async with db.connect() as connection:
        last = (await event_log.read_facts(connection, response_id))[-1]
    return token_facts.Chunk(last.position, event_log.encode(last.data), last.data)


async def test_remembered_chunk_agrees_with_the_log_and_with_a_writer_that_reads_it(db: AsyncEngine) -> None:
    remembering, reading = TokenChunks(), None
    steps = 2 * token_facts.CHUNK_CHARS // 6  # about two chunks' worth of ~6-character ids
    for step in range(steps):
        await _step(db, [("resp_mem", "tokens", {"ids": [100_000 + step]})], remembering)
        await _step(db, [("resp_read", "tokens", {"ids": [100_000 + step]})], reading)
        assert remembering.get("resp_mem") == await _chunk_in_log(db, "resp_mem")
    with_memory, without = await _facts(db, "resp_mem"), await _facts(db, "resp_read")
    assert with_memory == without and len(with_memory) >= 2  # the same chunks, rolled over at the same place
    merged = token_facts.merge_token_facts([data for _, data in with_memory])
    assert merged["ids"] == [100_000 + step for step in range(steps)]


async def test_a_remembered_chunk_is_extended_without_reading_it(db: AsyncEngine) -> None:
    chunks = TokenChunks()
    await _step(db, [("resp_a", "tokens", {"ids": [1]})], chunks)
    statements: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        if "run_facts" in statement:  # not PostgreSQL's append lock
            statements.append(statement.lstrip().split()[0].upper())

    sa.event.listen(db.sync_engine, "before_cursor_execute", record)
    try:
        for token in range(2, 6):
            await _step(db, [("resp_a", "tokens", {"ids": [token]})], chunks)
    finally:
        sa.event.remove(db.sync_engine, "before_cursor_execute", record)
    assert statements.count("UPDATE") == 4 and "SELECT" not in statements, statements
    assert await _facts(db, "resp_a") == [("tokens", {"ids": [1, 2, 3, 4, 5]})]


async def test_a_restarted_writer_extends_the_chunk_it_finds(db: AsyncEngine) -> None:
    await _step(db, [("resp_a", "request", {"x": 1}), ("resp_a", "tokens", {"ids": [1, 2]})], TokenChunks())
    restarted = TokenChunks()  # nothing remembered: the first step reads the log, the next ones do not
    await _step(db, [("resp_a", "tokens", {"ids": [3]})], restarted)
    assert restarted.get("resp_a") == await _chunk_in_log(db, "resp_a")
    await _step(db, [("resp_a", "tokens", {"ids": [4]})], restarted)
    assert await _facts(db, "resp_a") == [("request", {"x": 1}), ("tokens", {"ids": [1, 2, 3, 4]})]


async def test_a_fact_logged_by_someone_else_starts_a_new_chunk_after_it(db: AsyncEngine) -> None:
    chunks = TokenChunks()
    await _step(db, [("resp_a", "tokens", {"ids": [1]})], chunks)
    async with db.begin() as connection:  # a cancel request, from an HTTP handler: not through the writer
        await event_log.append_fact(connection, "resp_a", "cancel_requested", {})
    await _step(db, [("resp_a", "tokens", {"ids": [2]})], chunks)
    assert await _facts(db, "resp_a") == [
        ("tokens", {"ids": [1]}),
        ("cancel_requested", {}),
        ("tokens", {"ids": [2]}),
    ]
    assert chunks.get("resp_a") == await _chunk_in_log(db, "resp_a")


async def test_a_stale_memory_falls_back_to_reading_the_log(db: AsyncEngine) -> None:
    chunks = TokenChunks()
    await _step(db, [("resp_a", "tokens", {"ids": [1]})], chunks)
    # Another step landed without this memory hearing of it (a commit whose answer was lost).
    async with db.begin() as connection:
        await token_facts.append_tokens(connection, "resp_a", [{"ids": [2]}], datetime.now(UTC))
    await _step(db, [("resp_a", "tokens", {"ids": [3]})], chunks)
    assert await _facts(db, "resp_a") == [("tokens", {"ids": [1, 2, 3]})]  # 2 is kept, not overwritten


async def test_the_writers_own_tool_fact_ends_the_chunk(db: AsyncEngine) -> None:
    chunks = TokenChunks()
    await _step(
        db,
        [
            ("resp_a", "tokens", {"ids": [1]}),
            ("resp_a", "tool_call_started", {"index": 0}),
            ("resp_a", "tokens", {"ids": [2]}),
        ],
        chunks,
    )
    await _step(db, [("resp_a", "tokens", {"ids": [3]})], chunks)
    assert await _facts(db, "resp_a") == [
        ("tokens", {"ids": [1]}),
        ("tool_call_started", {"index": 0}),
        ("tokens", {"ids": [2, 3]}),
    ]


async def test_a_rolled_back_step_is_forgotten(db: AsyncEngine) -> None:
    chunks = TokenChunks()
    await _step(db, [("resp_a", "tokens", {"ids": [1]})], chunks)
    try:
        async with db.begin() as connection:
            await event_log.append_facts(connection, [("resp_a", "tokens", {"ids": [2]})], chunks)
            raise RuntimeError("the commit fails after the chunk was extended")
    except RuntimeError:
        pass
    # The memory says [1, 2], the log [1]: the guarded UPDATE does not apply, and the writer reads the log.
    await _step(db, [("resp_a", "tokens", {"ids": [3]})], chunks)
    assert await _facts(db, "resp_a") == [("tokens", {"ids": [1, 3]})]


async def test_one_write_extends_every_remembered_chunk_in_one_statement(db: AsyncEngine) -> None:
    runs = [f"resp_{i}" for i in range(5)]
    chunks = TokenChunks()
    await _step(db, [(rid, "tokens", {"ids": [1]}) for rid in runs], chunks)
    # resp_3's memory goes stale: a step of it landed unheard.
    async with db.begin() as connection:
        await token_facts.append_tokens(connection, "resp_3", [{"ids": [2]}], datetime.now(UTC))
    updates: list[int] = []
    selects = 0

    def record(_conn: object, _cursor: object, statement: str, params: object, *_args: object) -> None:
        nonlocal selects
        if "run_facts" not in statement:
            return
        if statement.lstrip().upper().startswith("UPDATE"):
            if isinstance(params, list):  # an executemany: a row of parameters per chunk
                updates.append(len(params))
            else:  # one statement: PostgreSQL's takes the chunks as arrays (positional $1..$4), others one row
                arrays = [value for value in params if isinstance(value, list)] if isinstance(params, tuple) else []
                updates.append(len(arrays[0]) if arrays else 1)
        elif statement.lstrip().upper().startswith("SELECT"):
            selects += 1

    sa.event.listen(db.sync_engine, "before_cursor_execute", record)
    try:
        await _step(db, [(rid, "tokens", {"ids": [3]}) for rid in runs], chunks)
    finally:
        sa.event.remove(db.sync_engine, "before_cursor_execute", record)
    # One statement for the five remembered chunks, then resp_3 alone by reading the log.
    assert updates == [5, 1], updates
    # PostgreSQL's statement says which chunks it extended: only resp_3's fallback reads (SQLite's executemany
    # counts its rows, and a count short of five sends it to see which ones landed).
    assert selects == (1 if db.dialect.name == "postgresql" else 2), selects
    for rid in runs:
        expected = [1, 2, 3] if rid == "resp_3" else [1, 3]
        assert await _facts(db, rid) == [("tokens", {"ids": expected})]
        assert chunks.get(rid) == await _chunk_in_log(db, rid)


def test_groups_survive_merging_and_joining() -> None:
    one, two = {"ids": [1]}, {"ids": [2, 3], "groups": [2]}
    assert token_facts.group_sizes(one) == [1]
    assert token_facts.merge_token_facts([one, {"ids": [4]}]) == {"ids": [1, 4]}  # all ones: no `groups`
    assert token_facts.merge_token_facts([one, two]) == {"ids": [1, 2, 3], "groups": [1, 2]}
    joined = token_facts.join_last_group(two, {"ids": [4]})
    assert joined == {"ids": [2, 3, 4], "groups": [3]}
    assert token_facts.join_last_group(one, {"ids": [5], "logprobs": ["x"]}) == {
        "ids": [1, 5],
        "logprobs": [None, "x"],
        "groups": [2],
    }
