"""The store's contract: one suite of tests over its operations, subclassed once per backend.

As pyeventsourcing's `tests/persistence.py` does for its recorders: each `…Contract` class below is abstract
(pytest collects only classes named `Test…`), and `tests/test_store_contract_sqlite.py` and
`tests/test_store_contract_postgres.py` subclass every one of them with a `Backend` that says how to get an
empty database and what differs on that backend (declared, never sniffed from the dialect by a test). A new
backend is one more file of subclasses; a new store operation is one more test here, run on every backend.

What is covered, by the store module it exercises:
- `EventLogContract` (store/event_log.py): append and read after a sequence number or a position, contiguous
  order, the `UNIQUE(response_id, sequence_number)` key as the concurrency check (a duplicate rolls the whole
  append back; concurrent appenders win each number exactly once), a reader tailing by position never skips a
  late commit, facts in order, several logs read together, the compact stored form of deltas;
- `TokenFactsContract` (store/token_facts.py): token ids in chunk facts, and the writer's memory of them;
- `LeaseContract` (store/leases.py): claim (disjoint across claimers), expiry, fencing, renewal, release,
  the per-project counts admission reads;
- `RecorderContract` (store/recorder.py): admission inside the create transaction, one terminal event and
  nothing after it, a lost lease or a taken sequence number drops only that run's write, delete;
- `WriteTransactionContract` (store/db.py `write_transaction`): commit, rollback, the SQLite writer's hop;
- `ConversationContract` (store/conversations.py, conversations/service.py): appends keep the high-water
  mark (rebuilds and the migration agree), cost the same at 10,000 items, pages chosen in SQL, and a
  response that names a conversation joins it in its terminal transaction.
"""

from __future__ import annotations

import asyncio
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from service.conversations.protocol import AddItemsRequest, CreateConversationRequest
from service.conversations.service import Conversations
from service.errors import InvalidRequest
from service.protocol import TERMINAL_EVENT_TYPES, CreateResponseRequest, derived_id
from service.protocol.response import initial_response
from service.store import conversations as conversation_store
from service.store import event_log, leases, read_models, recorder, token_facts
from service.store.db import create_engine, migrate, write_transaction
from service.store.doctor import check_database
from service.store.rebuild import rebuild_projections
from service.store.schema import conversations, events, run_facts, runs
from service.store.token_facts import TokenChunks


class Backend(ABC):
    """Where a contract's tests get their database, and what differs on that backend."""

    # A SQLite file's write transaction runs whole in its writer's thread, on a connection that never
    # suspends: awaiting anything else in it fails (store/sqlite_writer.py). Elsewhere it is engine.begin().
    writes_in_one_hop: ClassVar[bool]
    # The statement extending many token chunks at once says which rows it changed (PostgreSQL's
    # UPDATE … FROM unnest … RETURNING); elsewhere an executemany's count sends a short one to read the log.
    extend_reports_rows: ClassVar[bool]

    @abstractmethod
    def empty_database(self, tmp_path: Path) -> AbstractContextManager[str]:
        """An empty database for one test (its SQLAlchemy URL), removed afterwards; skips when unavailable."""

    @pytest.fixture
    def database_url(self, tmp_path: Path) -> Iterator[str]:
        with self.empty_database(tmp_path) as url:
            yield url

    @pytest.fixture
    async def db(self, database_url: str) -> AsyncIterator[AsyncEngine]:
        """The database migrated, and an engine on it."""
        await migrate(database_url)
        engine = create_engine(database_url)
        yield engine
        await engine.dispose()


PROJECT = "default"  # the conversations' owner


# -- helpers ------------------------------------------------------------------------------------------------
def _deltas(first: int, count: int) -> list[dict[str, object]]:
    return [
        {"type": "response.output_text.delta", "sequence_number": n, "delta": f"t{n}"}
        for n in range(first, first + count)
    ]


async def _append(db: AsyncEngine, response_id: str, stream_events: list[dict[str, object]]) -> int:
    async with db.begin() as connection:
        await event_log.lock_for_append(connection)
        return await event_log.append_events(connection, response_id, stream_events)


async def _facts(db: AsyncEngine, response_id: str) -> list[tuple[str, dict[str, Any]]]:
    async with db.connect() as connection:
        return [(f.kind, f.data) for f in await event_log.read_facts(connection, response_id)]


async def _step(db: AsyncEngine, rows: list[tuple[str, str, dict[str, Any]]], chunks: TokenChunks | None) -> None:
    """One writer's step: its facts appended as the group commit appends them."""
    async with db.begin() as connection:
        await event_log.lock_for_append(connection)
        await event_log.append_facts(connection, rows, chunks)


async def _chunk_in_log(db: AsyncEngine, response_id: str) -> token_facts.Chunk:
    async with db.connect() as connection:
        last = (await event_log.read_facts(connection, response_id))[-1]
    return token_facts.Chunk(last.position, event_log.encode(last.data), last.data)


async def _enqueue(db: AsyncEngine, count: int) -> list[str]:
    ids = [f"resp_{n:03d}" for n in range(count)]
    async with db.begin() as connection:
        for response_id in ids:
            await leases.enqueue(connection, response_id, background=True, owner=None, lease_seconds=10)
    return ids


async def _lease_of(db: AsyncEngine, response_id: str) -> tuple[str | None, float | None]:
    async with db.connect() as connection:
        row = (
            await connection.execute(
                sa.select(runs.c.owner, runs.c.lease_expires_at).where(runs.c.response_id == response_id)
            )
        ).one()
    return row.owner, row.lease_expires_at


def _response(response_id: str) -> dict[str, Any]:
    request = CreateResponseRequest.model_validate({"input": "hi", "background": True})
    return initial_response(request, response_id=response_id, model="m", created_at=0, max_output_tokens=None)


async def _create_response(
    db: AsyncEngine,
    response_id: str,
    *,
    project: str = "default",
    admit: Callable[[int, int], None] | None = None,
    request_fact: dict[str, Any] | None = None,
    input_items: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A response created as commands.create does (request fact, response.created, rows, queued run)."""
    response = _response(response_id)
    await recorder.create_response(
        db,
        request_fact=request_fact or {"request": {"input": "hi"}},
        created_event={"type": "response.created", "sequence_number": 0, "response": response},
        response=response,
        input_items=input_items or [],
        background=True,
        lease_seconds=10,
        project=project,
        admit=admit,
    )
    return response


def _message(item_id: str, role: str, text: str) -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"id": item_id, "type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def _ending(response: dict[str, Any], first: int, output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A run's last events from sequence number `first`: each output item done, then response.completed."""
    done = [
        {"type": "response.output_item.done", "sequence_number": first + n, "output_index": n, "item": item}
        for n, item in enumerate(output)
    ]
    completed = {**response, "status": "completed", "output": output, "completed_at": 1}
    return [*done, {"type": "response.completed", "sequence_number": first + len(output), "response": completed}]


def _terminal_write(
    response: dict[str, Any], first: int, output: list[dict[str, Any]], inputs: int
) -> recorder.RunWrite:
    ending = _ending(response, first, output)
    return recorder.RunWrite(
        response["id"],
        events=ending,
        projection=ending[-1]["response"],
        projection_through=ending[-1],
        output_ordinal_base=inputs,
        terminal=True,
    )


def _conversation_messages(first: int, count: int) -> AddItemsRequest:
    items = [{"type": "message", "role": "user", "content": f"item {n}"} for n in range(first, first + count)]
    return AddItemsRequest.model_validate({"items": items})


async def _create_conversation(service: Conversations, count: int = 0) -> str:
    items = [{"type": "message", "role": "user", "content": f"item {n}"} for n in range(count)]
    created = await service.create(CreateConversationRequest.model_validate({"items": items}), project=PROJECT)
    return str(created["id"])


async def _conversation_row(db: AsyncEngine, conversation_id: str) -> tuple[Any, ...]:
    async with db.connect() as connection:
        row = (await connection.execute(sa.select(conversations).where(conversations.c.id == conversation_id))).one()
    return tuple(row)


async def _next_ordinal(db: AsyncEngine, conversation_id: str) -> int:
    async with db.connect() as connection:
        return await conversation_store.next_ordinal(connection, conversation_id)


async def _append_cost(
    db: AsyncEngine, service: Conversations, conversation_id: str, first: int
) -> list[tuple[str, int, str]]:
    """(SQL, rows it returns, the database's plan for it) of each statement but plain INSERTs that one append
    of 20 items at ordinal `first` runs; a SELECT is run again to count its rows."""
    statements: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_args: Any) -> None:
        if not statement.lstrip().upper().startswith(("INSERT", "BEGIN", "COMMIT", "ROLLBACK", "PRAGMA")):
            statements.append((statement, parameters))

    sa.event.listen(db.sync_engine, "before_cursor_execute", record)
    try:
        await service.add_items(conversation_id, _conversation_messages(first, 20), project=PROJECT)
    finally:
        sa.event.remove(db.sync_engine, "before_cursor_execute", record)
    explain = "EXPLAIN QUERY PLAN " if db.dialect.name == "sqlite" else "EXPLAIN "
    cost = []
    async with db.begin() as connection:
        for statement, parameters in statements:
            plan = await connection.exec_driver_sql(explain + statement, parameters)
            text = " | ".join(" ".join(str(cell) for cell in row) for row in plan.fetchall())
            rows = 0
            if statement.lstrip().upper().startswith("SELECT"):
                rows = len((await connection.exec_driver_sql(statement, parameters)).fetchall())
            cost.append((statement, rows, text))
        await connection.rollback()  # the plans of UPDATEs were not run; nothing else is kept either
    return cost


def _scans(plan: str, table: str) -> bool:
    """Whether a plan reads `table` whole: SQLite's `SCAN table` (with or without a covering index), PostgreSQL's
    `Seq Scan on table`."""
    lowered = plan.lower()
    return f"scan {table}" in lowered or f"seq scan on {table}" in lowered


@contextmanager
def _item_reads(db: AsyncEngine) -> Iterator[list[str]]:
    """The SQL of every statement that reads items' JSON (`conversation_entries.data`)."""
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "conversation_entries.data" in statement:
            statements.append(statement)

    sa.event.listen(db.sync_engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        sa.event.remove(db.sync_engine, "before_cursor_execute", record)


# -- the event log ------------------------------------------------------------------------------------------
class EventLogContract(Backend):
    async def test_append_then_read_after(self, db: AsyncEngine) -> None:
        await _append(db, "resp_a", _deltas(0, 3))
        await _append(db, "resp_b", _deltas(0, 2))
        await _append(db, "resp_a", _deltas(3, 2))
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

    async def test_a_group_append_takes_positions_in_the_order_given(self, db: AsyncEngine) -> None:
        """One statement for several runs (a group commit): each event's position follows the order of the
        batch, each run's last position is reported, and each run reads back 0..N in order."""
        batch: list[tuple[str, list[dict[str, Any]]]] = [("resp_a", _deltas(0, 3)), ("resp_b", _deltas(0, 2))]
        async with db.begin() as connection:
            await event_log.lock_for_append(connection)
            last = await event_log.append_events_of_runs(connection, [*batch, ("resp_none", [])])
            more = await event_log.append_events_of_runs(connection, [("resp_b", _deltas(2, 1))])
        async with db.connect() as connection:
            log = await event_log.read_all_events(connection)
            by_run = await event_log.last_sequence_numbers(connection, ["resp_a", "resp_b", "resp_none"])
        assert [(e.response_id, e.sequence_number) for e in log] == [
            ("resp_a", 0),
            ("resp_a", 1),
            ("resp_a", 2),
            ("resp_b", 0),
            ("resp_b", 1),
            ("resp_b", 2),
        ]
        assert [e.position for e in log] == sorted({e.position for e in log})  # increasing, no repeat
        assert last == {"resp_a": log[2].position, "resp_b": log[4].position}  # a run with no events: absent
        assert more == {"resp_b": log[5].position}
        assert by_run == {"resp_a": 2, "resp_b": 2, "resp_none": -1}

    async def test_the_whole_log_is_read_by_position_in_pages_without_gaps_or_repeats(self, db: AsyncEngine) -> None:
        """`read_all_events(after_position=, limit=)` (rebuilds, doctor, catch-up) and `read_events(after_position=)`
        (a GET folding what follows its row's position)."""
        for n in range(5):
            await _append(db, "resp_a", _deltas(2 * n, 2))
            await _append(db, "resp_b", _deltas(3 * n, 3))
        async with db.connect() as connection:
            whole = await event_log.read_all_events(connection)
            pages, after = [], 0
            while page := await event_log.read_all_events(connection, after_position=after, limit=7):
                pages.append(page)
                after = page[-1].position
            middle = whole[len(whole) // 2].position
            a_after = await event_log.read_events(connection, "resp_a", after_position=middle)
            a_after_limited = await event_log.read_events(connection, "resp_a", after=3, limit=2)
        assert len(whole) == 25 and [len(page) for page in pages] == [7, 7, 7, 4]
        assert [e for page in pages for e in page] == whole
        assert a_after == [e for e in whole if e.response_id == "resp_a" and e.position > middle]
        assert [e.sequence_number for e in a_after_limited] == [4, 5]

    async def test_duplicate_sequence_number_fails_and_writes_nothing(self, db: AsyncEngine) -> None:
        await _append(db, "resp_a", _deltas(0, 3))
        with pytest.raises(event_log.SequenceConflict):
            # 3 is new but 2 is taken: the whole transaction must roll back
            await _append(db, "resp_a", _deltas(2, 2))
        async with db.connect() as connection:
            assert [e.sequence_number for e in await event_log.read_events(connection, "resp_a")] == [0, 1, 2]

    async def test_concurrent_appenders_exactly_one_wins_each_sequence_number(
        self, db: AsyncEngine, database_url: str
    ) -> None:
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

    async def test_tailing_by_position_never_skips_a_late_commit(self, db: AsyncEngine, database_url: str) -> None:
        """A slow transaction that took its position first must not be overtaken by a later one (on PostgreSQL
        this fails without the append lock)."""
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
                await event_log.append_events(connection, "resp_slow", _deltas(0, 1))
                await asyncio.sleep(0.5)  # position taken, commit delayed

        async def fast() -> None:
            await asyncio.sleep(0.1)
            await _append(fast_writer, "resp_fast", _deltas(0, 1))

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

    async def test_facts_are_kept_per_response_in_order(self, db: AsyncEngine) -> None:
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
        # A run's token ids go into its current chunk: one `tokens` fact, not one per step.
        assert await _facts(db, "resp_a") == [("request", {"x": 1}), ("tokens", {"ids": [5, 6]})]

    async def test_several_responses_logs_are_read_together_as_each_alone(self, db: AsyncEngine) -> None:
        """read_logs (runs claimed together): per response, the facts and events read_facts and read_events give."""
        await _append(db, "resp_a", _deltas(0, 2))
        await _append(db, "resp_b", _deltas(0, 3))
        await _append(db, "resp_a", _deltas(2, 2))
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

    async def test_deltas_are_stored_compact_and_read_as_sent(self, db: AsyncEngine) -> None:
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

    async def test_a_stream_gets_the_events_that_arrived_together_as_one_run(self, db: AsyncEngine) -> None:
        """The SSE route writes each run in one send: a replay is one write per page, not one per event."""
        from service.http.sse import tail_event_batches
        from service.notify import Notifier

        terminal = {"type": "response.completed", "sequence_number": 5, "response": {}}
        await _append(db, "resp_a", _deltas(0, 5) + [terminal])

        async def batches(after: int) -> list[list[int]]:
            tail = tail_event_batches(db, Notifier(), "resp_a", after=after, poll_interval=0.05)
            return [[e.sequence_number for e in batch] async for batch in tail]

        assert await batches(-1) == [[0, 1, 2, 3, 4, 5]]
        assert await batches(2) == [[3, 4, 5]]


# -- token facts --------------------------------------------------------------------------------------------
class TokenFactsContract(Backend):
    """The writer's memory of each run's last token chunk (token_facts.TokenChunks): what it writes is what a
    writer reading the log would write, and a stale memory only costs a read."""

    async def test_token_chunks_roll_over_and_keep_their_order(self, db: AsyncEngine) -> None:
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

    async def test_remembered_chunk_agrees_with_the_log_and_with_a_writer_that_reads_it(self, db: AsyncEngine) -> None:
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

    async def test_a_remembered_chunk_is_extended_without_reading_it(self, db: AsyncEngine) -> None:
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

    async def test_a_restarted_writer_extends_the_chunk_it_finds(self, db: AsyncEngine) -> None:
        await _step(db, [("resp_a", "request", {"x": 1}), ("resp_a", "tokens", {"ids": [1, 2]})], TokenChunks())
        restarted = TokenChunks()  # nothing remembered: the first step reads the log, the next ones do not
        await _step(db, [("resp_a", "tokens", {"ids": [3]})], restarted)
        assert restarted.get("resp_a") == await _chunk_in_log(db, "resp_a")
        await _step(db, [("resp_a", "tokens", {"ids": [4]})], restarted)
        assert await _facts(db, "resp_a") == [("request", {"x": 1}), ("tokens", {"ids": [1, 2, 3, 4]})]

    async def test_a_fact_logged_by_someone_else_starts_a_new_chunk_after_it(self, db: AsyncEngine) -> None:
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

    async def test_a_stale_memory_falls_back_to_reading_the_log(self, db: AsyncEngine) -> None:
        chunks = TokenChunks()
        await _step(db, [("resp_a", "tokens", {"ids": [1]})], chunks)
        # Another step landed without this memory hearing of it (a commit whose answer was lost).
        async with db.begin() as connection:
            await token_facts.append_tokens(connection, "resp_a", [{"ids": [2]}], datetime.now(UTC))
        await _step(db, [("resp_a", "tokens", {"ids": [3]})], chunks)
        assert await _facts(db, "resp_a") == [("tokens", {"ids": [1, 2, 3]})]  # 2 is kept, not overwritten

    async def test_the_writers_own_tool_fact_ends_the_chunk(self, db: AsyncEngine) -> None:
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

    async def test_a_rolled_back_step_is_forgotten(self, db: AsyncEngine) -> None:
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

    async def test_one_write_extends_every_remembered_chunk_in_one_statement(self, db: AsyncEngine) -> None:
        rids = [f"resp_{i}" for i in range(5)]
        chunks = TokenChunks()
        await _step(db, [(rid, "tokens", {"ids": [1]}) for rid in rids], chunks)
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
            await _step(db, [(rid, "tokens", {"ids": [3]}) for rid in rids], chunks)
        finally:
            sa.event.remove(db.sync_engine, "before_cursor_execute", record)
        # One statement for the five remembered chunks, then resp_3 alone by reading the log.
        assert updates == [5, 1], updates
        # A statement that says which chunks it extended: only resp_3's fallback reads (an executemany counts
        # its rows, and a count short of five sends it to see which ones landed).
        assert selects == (1 if self.extend_reports_rows else 2), selects
        for rid in rids:
            expected = [1, 2, 3] if rid == "resp_3" else [1, 3]
            assert await _facts(db, rid) == [("tokens", {"ids": expected})]
            assert chunks.get(rid) == await _chunk_in_log(db, rid)


# -- leases -------------------------------------------------------------------------------------------------
class LeaseContract(Backend):
    """The run table: concurrent claimers take disjoint runs, expired leases are claimable again, and the fence
    renews only what a worker still owns."""

    async def test_concurrent_claimers_take_disjoint_runs(self, db: AsyncEngine, database_url: str) -> None:
        ids = await _enqueue(db, 30)
        workers = [create_engine(database_url) for _ in range(3)]

        async def claim_all(worker: AsyncEngine, name: str) -> list[str]:
            taken: list[str] = []
            while True:
                async with worker.begin() as connection:
                    batch = await leases.claim(connection, name, lease_seconds=10, limit=4)
                if not batch:
                    return taken
                taken += [run.response_id for run in batch]

        try:
            results = await asyncio.gather(*(claim_all(w, f"worker-{n}") for n, w in enumerate(workers)))
        finally:
            for worker in workers:
                await worker.dispose()
        claimed = [rid for taken in results for rid in taken]
        assert sorted(claimed) == ids, "every run claimed exactly once"

    async def test_expired_leases_are_claimed_again_and_the_fence_knows_its_owner(self, db: AsyncEngine) -> None:
        ids = await _enqueue(db, 2)
        async with db.begin() as connection:
            first = await leases.claim(connection, "worker-a", lease_seconds=10, limit=10)
        assert [run.response_id for run in first] == ids and all(run.claims == 1 for run in first)
        async with db.begin() as connection:
            assert await leases.claim(connection, "worker-b", lease_seconds=10, limit=10) == []
            # worker-a's leases run out (set in the past rather than waited for: a slow machine under load
            # once took longer than a short lease between the two claims above)
            await connection.execute(sa.update(runs).values(lease_expires_at=time.time() - 1))
        async with db.begin() as connection:
            second = await leases.claim(connection, "worker-b", lease_seconds=10, limit=1)
        assert [run.response_id for run in second] == ids[:1] and second[0].claims == 2
        async with db.begin() as connection:
            # worker-a lost the first run; it still holds the second (its lease expired but nobody took it)
            assert await leases.fence(connection, "worker-a", ids, lease_seconds=10) == {ids[1]: False}
            await leases.request_cancel(connection, ids[0])
            assert await leases.fence(connection, "worker-b", ids, lease_seconds=10) == {ids[0]: True}
            await leases.mark_done(connection, ids[0])
            assert await leases.fence(connection, "worker-b", ids, lease_seconds=10) == {}

    async def test_the_fence_renews_the_lease_and_release_hands_the_run_back_at_once(self, db: AsyncEngine) -> None:
        (rid, other) = await _enqueue(db, 2)
        async with db.begin() as connection:
            await leases.claim(connection, "worker-a", lease_seconds=5, limit=2)
        _, claimed_until = await _lease_of(db, rid)
        assert claimed_until is not None
        async with db.begin() as connection:
            assert await leases.fence(connection, "worker-a", [rid], lease_seconds=600) == {rid: False}
        owner, renewed_until = await _lease_of(db, rid)
        assert owner == "worker-a" and renewed_until is not None and renewed_until >= claimed_until + 500
        async with db.begin() as connection:
            await leases.release(connection, "worker-b", [rid])  # not worker-b's: nothing changes
        assert await _lease_of(db, rid) == ("worker-a", renewed_until)
        async with db.begin() as connection:
            await leases.release(connection, "worker-a", [rid])
        assert await _lease_of(db, rid) == (None, None)
        async with db.begin() as connection:  # claimable at once, without waiting for the lease to run out
            again = await leases.claim(connection, "worker-b", lease_seconds=5, limit=10)
            assert await leases.fence(connection, "worker-a", [rid, other], lease_seconds=5) == {other: False}
        assert [(run.response_id, run.claims) for run in again] == [(rid, 2)]

    async def test_unfinished_runs_are_counted_per_project_and_in_all_in_one_statement(self, db: AsyncEngine) -> None:
        async with db.connect() as connection:
            assert await leases.unfinished_runs_of(connection, "proj_a") == (0, 0)
        async with db.begin() as connection:
            for n, project in enumerate(["proj_a", "proj_a", "proj_b", "proj_a"]):
                await leases.enqueue(
                    connection, f"resp_{n}", background=True, owner=None, lease_seconds=10, project=project
                )
            await leases.mark_done(connection, "resp_3")  # finished runs do not count
        async with db.connect() as connection:
            assert await leases.unfinished_runs_of(connection, "proj_a") == (2, 3)
            assert await leases.unfinished_runs_of(connection, "proj_b") == (1, 3)
            assert await leases.unfinished_runs_of(connection, "proj_c") == (0, 3)
            assert await leases.unfinished_runs(connection) == 3


# -- the recorder -------------------------------------------------------------------------------------------
class RecorderContract(Backend):
    async def test_creates_racing_for_the_last_place_are_admitted_one_at_a_time(
        self, db: AsyncEngine, database_url: str
    ) -> None:
        """The admission check counts the runs inside the create transaction, under the append lock: of many
        creates at once with room for two more runs, exactly two are written, and a refused one leaves no trace."""

        def admit(project_runs: int, all_runs: int) -> None:
            if project_runs >= 3:
                raise RuntimeError("full")

        async def create(writer: AsyncEngine, n: int) -> str:
            response_id = f"resp_limit_{n:03d}"
            await _create_response(writer, response_id, project="proj_a", admit=admit)
            return response_id

        await create(db, 0)
        writers = [create_engine(database_url) for _ in range(6)]
        try:
            results = await asyncio.gather(
                *(create(writer, n) for n, writer in enumerate(writers, start=1)), return_exceptions=True
            )
        finally:
            for writer in writers:
                await writer.dispose()
        written = [r for r in results if isinstance(r, str)]
        assert len(written) == 2 and all(isinstance(r, RuntimeError) for r in results if not isinstance(r, str))
        async with db.connect() as connection:
            assert await leases.unfinished_runs_of(connection, "proj_a") == (3, 3)
            stored = set(await connection.scalars(sa.select(events.c.response_id).distinct()))
        assert stored == {"resp_limit_000", *written}

    async def test_one_terminal_event_and_nothing_after_it(self, db: AsyncEngine) -> None:
        """The terminal write marks the run done in its own transaction; every later write is fenced off (the
        owner's own included) and a cancel after it is refused, so the log ends with exactly one terminal event."""
        response = await _create_response(db, "resp_end")
        async with db.begin() as connection:
            await leases.claim(connection, "worker-a", lease_seconds=30, limit=1)
        step = recorder.RunWrite("resp_end", facts=[("tokens", {"ids": [1, 2]})], events=_deltas(1, 2))
        outcome = await recorder.commit_step(db, "worker-a", [step], lease_seconds=30)
        assert outcome.lost == set() and outcome.cancel_requested == {"resp_end": False}
        answer = _message("msg_end", "assistant", "t1t2")
        outcome = await recorder.commit_step(
            db, "worker-a", [_terminal_write(response, 3, [answer], 0)], lease_seconds=30
        )
        assert outcome.lost == set()

        late = recorder.RunWrite("resp_end", facts=[("tokens", {"ids": [3]})], events=_deltas(5, 1))
        outcome = await recorder.commit_step(db, "worker-a", [late], lease_seconds=30)
        assert outcome.lost == {"resp_end"}
        assert not await recorder.request_cancel(db, "resp_end", project=None)
        async with db.connect() as connection:
            logged = await event_log.read_events(connection, "resp_end")
            facts = await event_log.read_facts(connection, "resp_end")
            run = await leases.get_run(connection, "resp_end")
            row = await read_models.get_response(connection, "resp_end", project=None)
            items = await read_models.list_items(connection, "resp_end", project=None)
        assert [e.sequence_number for e in logged] == [0, 1, 2, 3, 4]
        assert [e.type for e in logged if e.type in TERMINAL_EVENT_TYPES] == ["response.completed"] == [logged[-1].type]
        assert [f.kind for f in facts] == ["request", "tokens"] and facts[1].data == {"ids": [1, 2]}
        assert run.done and run.owner is None
        assert row is not None and row["status"] == "completed" and row["output"] == [answer]
        assert items == [answer]

    async def test_a_write_is_dropped_when_its_run_was_lost_or_its_sequence_numbers_taken(
        self, db: AsyncEngine
    ) -> None:
        """The fence and the unique key: a worker whose lease another took writes nothing for that run, and a
        write whose sequence numbers are taken (a rival got there first) is dropped alone, the rest of the
        group commit landing."""
        for rid in ("resp_x", "resp_y", "resp_z"):
            await _create_response(db, rid)
        async with db.begin() as connection:
            await leases.claim(connection, "worker-a", lease_seconds=30, limit=3)
            await connection.execute(
                sa.update(runs).where(runs.c.response_id == "resp_z").values(owner="worker-b")  # taken over
            )
        taken = {"type": "response.in_progress", "sequence_number": 1}
        outcome = await recorder.commit_step(
            db, "worker-a", [recorder.RunWrite("resp_x", events=[taken])], lease_seconds=30
        )
        assert outcome.lost == set()
        writes = [
            recorder.RunWrite("resp_x", events=[taken]),  # sequence number 1 is taken now
            recorder.RunWrite("resp_y", facts=[("tokens", {"ids": [7]})], events=[taken]),
            recorder.RunWrite("resp_z", events=[taken]),  # worker-b's run now
        ]
        outcome = await recorder.commit_step(db, "worker-a", writes, lease_seconds=30)
        assert outcome.lost == {"resp_x", "resp_z"} and outcome.cancel_requested == {"resp_y": False}
        async with db.connect() as connection:
            logs = await event_log.read_logs(connection, ["resp_x", "resp_y", "resp_z"])
        assert {rid: [e.sequence_number for e in log[1]] for rid, log in logs.items()} == {
            "resp_x": [0, 1],
            "resp_y": [0, 1],
            "resp_z": [0],
        }
        assert [f.kind for f in logs["resp_y"][0]] == ["request", "tokens"]
        assert await recorder.landed(db, writes[1:2]) == {"resp_y"}

    async def test_a_deleted_response_leaves_nothing_and_only_its_project_may_delete_it(self, db: AsyncEngine) -> None:
        await _create_response(db, "resp_gone", project="proj_a", input_items=[_message("msg_in", "user", "hi")])
        await _create_response(db, "resp_kept", project="proj_a")
        assert not await recorder.delete_response(db, "resp_gone", project="proj_b")
        assert await recorder.delete_response(db, "resp_gone", project="proj_a")
        assert not await recorder.delete_response(db, "resp_gone", project=None)  # already gone
        async with db.connect() as connection:
            left = {
                table.name: set(await connection.scalars(sa.select(column).distinct()))
                for table, column in (
                    (events, events.c.response_id),
                    (run_facts, run_facts.c.response_id),
                    (runs, runs.c.response_id),
                )
            }
            assert await read_models.get_response(connection, "resp_gone", project=None) is None
            assert await read_models.list_items(connection, "resp_gone", project=None) == []
        assert left == {"events": {"resp_kept"}, "run_facts": {"resp_kept"}, "runs": {"resp_kept"}}


# -- write transactions -------------------------------------------------------------------------------------
class WriteTransactionContract(Backend):
    """write_transaction: one write transaction, committed or rolled back as `engine.begin()` would; on a
    SQLite file the whole of it runs in the writer's thread (service/store/sqlite_writer.py)."""

    async def test_a_transaction_commits_what_it_wrote_and_returns_its_result(self, db: AsyncEngine) -> None:
        threads: list[str] = []

        async def body(connection: Any) -> int:
            threads.append(threading.current_thread().name)
            await event_log.lock_for_append(connection)
            await event_log.append_fact(connection, "resp_a", "request", {"n": 1})
            await event_log.append_facts(connection, [("resp_a", "tokens", {"ids": [1, 2]})])
            return int(await connection.scalar(sa.select(sa.func.count()).select_from(run_facts)))

        assert await write_transaction(db, body) == 2
        assert await _facts(db, "resp_a") == [("request", {"n": 1}), ("tokens", {"ids": [1, 2]})]
        # one hop: the whole body ran in the writer's thread
        assert threads[0].startswith("sqlite-writer") == self.writes_in_one_hop

    async def test_a_transaction_that_raises_leaves_nothing(self, db: AsyncEngine) -> None:
        async def body(connection: Any) -> None:
            await event_log.append_fact(connection, "resp_b", "request", {"n": 1})
            raise ValueError("refused")

        with pytest.raises(ValueError, match="refused"):
            await write_transaction(db, body)
        assert await _facts(db, "resp_b") == []

    async def test_a_body_that_awaits_anything_else_fails_and_writes_nothing_on_sqlite(self, db: AsyncEngine) -> None:
        async def body(connection: Any) -> None:
            await event_log.append_fact(connection, "resp_c", "request", {"n": 1})
            await asyncio.sleep(0)

        if not self.writes_in_one_hop:
            await write_transaction(db, body)  # an ordinary transaction: it may await anything
            assert await _facts(db, "resp_c") == [("request", {"n": 1})]
            return
        with pytest.raises(RuntimeError):
            await write_transaction(db, body)
        assert await _facts(db, "resp_c") == []

    async def test_the_writer_and_the_async_engine_take_turns_at_the_write_lock(self, db: AsyncEngine) -> None:
        """Writes from both paths at once (a group commit beside a POST's create) all land, in some order."""

        async def through_writer(i: int) -> None:
            async def body(connection: Any) -> None:
                await event_log.append_fact(connection, f"resp_w{i}", "request", {"i": i})

            await write_transaction(db, body)

        async def through_begin(i: int) -> None:
            async with db.begin() as connection:
                await event_log.append_fact(connection, f"resp_b{i}", "request", {"i": i})

        await asyncio.gather(*(f(i) for i in range(10) for f in (through_writer, through_begin)))
        async with db.connect() as connection:
            count = await connection.scalar(sa.select(sa.func.count()).select_from(run_facts))
        assert count == 20


# -- conversations ------------------------------------------------------------------------------------------
class ConversationContract(Backend):
    """Conversations at length: an append reads the row's high-water mark (never a fold of the whole log), a
    deleted last item's ordinal is not reused (rebuilds and the migration's backfill agree), a page of items is
    chosen in SQL, and a response's items join its conversation when it ends."""

    async def test_a_deleted_last_items_ordinal_is_not_reused_and_rebuilds_keep_the_high_water_mark(
        self, db: AsyncEngine, database_url: str
    ) -> None:
        service = Conversations(db)
        conversation_id = await _create_conversation(service, 3)
        listed = await service.list_items(conversation_id, after=None, limit=100, order="asc", project=PROJECT)
        ids = [item["id"] for item in listed["data"]]
        await service.delete_item(conversation_id, ids[-1], project=PROJECT)
        assert await _next_ordinal(db, conversation_id) == 3  # the deleted item keeps its ordinal

        added = await service.add_items(conversation_id, _conversation_messages(3, 2), project=PROJECT)
        new_ids = [item["id"] for item in added["data"]]
        assert ids[-1] not in new_ids  # ids derive from ordinals: a reused ordinal would repeat an id
        async with db.connect() as connection:
            ordinals = [ordinal for ordinal, _ in await conversation_store.list_entries(connection, conversation_id)]
        assert ordinals == [0, 1, 3, 4] and await _next_ordinal(db, conversation_id) == 5

        # Delete the last again: the mark stays, a rebuild refolds it from the log, the doctor agrees.
        await service.delete_item(conversation_id, new_ids[-1], project=PROJECT)
        empty = await _create_conversation(service)
        before = {cid: await _conversation_row(db, cid) for cid in (conversation_id, empty)}
        assert before[conversation_id][-1] == 5 and before[empty][-1] == 0
        await rebuild_projections(database_url)
        assert {cid: await _conversation_row(db, cid) for cid in (conversation_id, empty)} == before
        report = await check_database(database_url)
        assert not report.problems and report.conversations == 2
        added = await service.add_items(conversation_id, _conversation_messages(5, 1), project=PROJECT)
        async with db.connect() as connection:
            assert await conversation_store.ordinal_of(connection, conversation_id, added["data"][0]["id"]) == 5

    async def test_the_migration_backfills_the_high_water_mark_from_the_log(
        self, db: AsyncEngine, database_url: str
    ) -> None:
        """Rows written before revision 0006 get `next_ordinal` from their logs, deleted last items included."""
        from alembic import command

        from service.store.db import alembic_config, migrate_sync

        service = Conversations(db)
        trimmed = await _create_conversation(service, 2)
        await service.add_items(trimmed, _conversation_messages(2, 3), project=PROJECT)
        last = (await service.list_items(trimmed, after=None, limit=1, order="desc", project=PROJECT))["data"][0]
        await service.delete_item(trimmed, last["id"], project=PROJECT)
        untouched, empty = await _create_conversation(service, 4), await _create_conversation(service)
        expected = {trimmed: 5, untouched: 4, empty: 0}
        await db.dispose()

        await asyncio.to_thread(command.downgrade, alembic_config(database_url), "0005")
        await asyncio.to_thread(migrate_sync, database_url)
        assert {cid: await _next_ordinal(db, cid) for cid in expected} == expected
        assert not (await check_database(database_url)).problems

    async def test_an_append_costs_the_same_at_10000_items_as_at_the_first(self, db: AsyncEngine) -> None:
        """10,000 items, 20 per append: the append at 10,000 items runs the same statements as at 100, its reads
        return as many rows, none reads items' JSON, and the database plans none as a scan of the items or the
        log (a fold of the log on each append made the last ones ~40x slower). Counted, not timed."""
        service = Conversations(db)
        conversation_id = await _create_conversation(service)
        appends = 500
        for n in range(5):
            await service.add_items(conversation_id, _conversation_messages(20 * n, 20), project=PROJECT)
        early = await _append_cost(db, service, conversation_id, 100)
        for n in range(6, appends):
            await service.add_items(conversation_id, _conversation_messages(20 * n, 20), project=PROJECT)
        late = await _append_cost(db, service, conversation_id, 20 * appends)
        assert await _next_ordinal(db, conversation_id) == 20 * appends + 20
        assert [(sql, rows) for sql, rows, _ in late] == [(sql, rows) for sql, rows, _ in early]
        for sql, _, plan in late:
            assert "conversation_entries.data" not in sql or not sql.lstrip().upper().startswith("SELECT"), sql
            assert not _scans(plan, "conversation_entries") and not _scans(plan, "events"), (sql, plan)

    async def test_listing_pages_in_sql_with_limit_after_and_order(self, db: AsyncEngine) -> None:
        service = Conversations(db)
        conversation_id = await _create_conversation(service, 20)
        await service.add_items(conversation_id, _conversation_messages(20, 20), project=PROJECT)
        await service.add_items(conversation_id, _conversation_messages(40, 5), project=PROJECT)
        listed = await service.list_items(conversation_id, after=None, limit=100, order="asc", project=PROJECT)
        every = [item["id"] for item in listed["data"]]
        await service.delete_item(conversation_id, every.pop(7), project=PROJECT)  # a gap in the ordinals
        assert len(every) == 44

        async def walk(order: Any, limit: int) -> list[list[str]]:
            pages, after = [], None
            while True:
                page = await service.list_items(conversation_id, after=after, limit=limit, order=order, project=PROJECT)
                ids = [item["id"] for item in page["data"]]
                assert (page["first_id"], page["last_id"]) == ((ids[0], ids[-1]) if ids else (None, None))
                pages.append(ids)
                if not page["has_more"]:
                    return pages
                after = page["last_id"]

        with _item_reads(db) as reads:
            ascending = await walk("asc", 10)
            descending = await walk("desc", 7)
        assert ascending == [every[n : n + 10] for n in range(0, 44, 10)]
        reversed_ids = every[::-1]
        assert descending == [reversed_ids[n : n + 7] for n in range(0, 44, 7)]
        assert len(reads) == len(ascending) + len(descending)
        assert all("LIMIT" in statement.upper() for statement in reads), reads

        with _item_reads(db) as reads:
            page = await service.list_items(conversation_id, after=every[40], limit=20, order="asc", project=PROJECT)
            assert [item["id"] for item in page["data"]] == every[41:] and not page["has_more"]
            page = await service.list_items(conversation_id, after=every[0], limit=20, order="desc", project=PROJECT)
            assert page["data"] == [] and not page["has_more"] and page["first_id"] is None
            assert (await service.get_item(conversation_id, every[3], project=PROJECT))["id"] == every[3]
        assert len(reads) == 3 and all("LIMIT" in statement.upper() for statement in reads)
        with pytest.raises(InvalidRequest) as unknown:
            await service.list_items(conversation_id, after="msg_missing", limit=20, order="asc", project=PROJECT)
        assert unknown.value.param == "after"

    async def test_a_response_that_names_a_conversation_joins_it_in_its_terminal_transaction(
        self, db: AsyncEngine
    ) -> None:
        """The recorder's terminal commit appends the response's input and output items to its conversation
        (store/conversations.append_response_items), after the items already there; a conversation deleted
        meanwhile is skipped, not an error."""
        service = Conversations(db)
        conversation_id = await _create_conversation(service, 1)
        asked = _message("msg_asked", "user", "and then?")
        answer = _message("msg_answer", "assistant", "then this")
        fact = {"request": {"input": "and then?"}, "conversation_id": conversation_id}
        response = await _create_response(db, "resp_turn", request_fact=fact, input_items=[asked])
        gone_id = await _create_conversation(service)
        fact = {"request": {"input": "hi"}, "conversation_id": gone_id}
        orphan = await _create_response(db, "resp_orphan", request_fact=fact, input_items=[asked])
        await service.delete(gone_id, project=PROJECT)
        async with db.begin() as connection:
            await leases.claim(connection, "worker-a", lease_seconds=30, limit=2)

        writes = [_terminal_write(response, 1, [answer], 1), _terminal_write(orphan, 1, [answer], 1)]
        outcome = await recorder.commit_step(db, "worker-a", writes, lease_seconds=30)
        assert outcome.lost == set()
        async with db.connect() as connection:
            entries = await conversation_store.list_entries(connection, conversation_id)
            stream = await event_log.read_events(connection, conversation_id)
            orphan_stream = await event_log.read_events(connection, gone_id)
        assert [item["id"] for _, item in entries][1:] == ["msg_asked", "msg_answer"]
        assert [ordinal for ordinal, _ in entries] == [0, 1, 2] and await _next_ordinal(db, conversation_id) == 3
        added = stream[-1].payload()
        assert added["type"] == "conversation.items.added"
        assert [(e["source"], e["response_id"]) for e in added["entries"]] == [
            ("input", "resp_turn"),
            ("output", "resp_turn"),
        ]
        assert orphan_stream == []
