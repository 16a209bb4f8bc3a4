"""The run table on SQLite and PostgreSQL: concurrent claimers take disjoint runs, expired leases
are claimable again, and the fence renews only what a worker still owns."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from service.protocol import CreateResponseRequest
from service.protocol.response import initial_response
from service.store import leases, recorder
from service.store.db import create_engine
from service.store.schema import events, runs


async def _enqueue(db: AsyncEngine, count: int) -> list[str]:
    ids = [f"resp_{n:03d}" for n in range(count)]
    async with db.begin() as connection:
        for response_id in ids:
            await leases.enqueue(connection, response_id, background=True, owner=None, lease_seconds=10)
    return ids


async def test_concurrent_claimers_take_disjoint_runs(db: AsyncEngine, database_url: str) -> None:
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


async def test_expired_leases_are_claimed_again_and_the_fence_knows_its_owner(db: AsyncEngine) -> None:
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


async def test_unfinished_runs_are_counted_per_project_and_in_all_in_one_statement(db: AsyncEngine) -> None:
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


async def _create(db: AsyncEngine, n: int, admit: Callable[[int, int], None]) -> str:
    response_id = f"resp_limit_{n:03d}"
    request = CreateResponseRequest.model_validate({"input": "hi", "background": True})
    response = initial_response(request, response_id=response_id, model="m", created_at=0, max_output_tokens=None)
    created = {"type": "response.created", "sequence_number": 0, "response": response}
    await recorder.create_response(
        db,
        request_fact={"request": {"input": "hi"}},
        created_event=created,
        response=response,
        input_items=[],
        background=True,
        lease_seconds=10,
        project="proj_a",
        admit=admit,
    )
    return response_id


async def test_creates_racing_for_the_last_place_are_admitted_one_at_a_time(db: AsyncEngine, database_url: str) -> None:
    """The admission check counts the runs inside the create transaction, under the append lock: of many
    creates at once with room for two more runs, exactly two are written, and a refused one leaves no trace."""

    def admit(project_runs: int, all_runs: int) -> None:
        if project_runs >= 3:
            raise RuntimeError("full")

    await _create(db, 0, admit)
    writers = [create_engine(database_url) for _ in range(6)]
    try:
        results = await asyncio.gather(
            *(_create(writer, n, admit) for n, writer in enumerate(writers, start=1)), return_exceptions=True
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
