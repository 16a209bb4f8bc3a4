"""Retention end to end: with a horizon of a few seconds, the sweeper deletes expired responses and
conversations whole (log, facts, run, projections) while new requests keep arriving, and the
database passes `doctor` afterwards."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import openai
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from service.store import compaction_state
from service.store.db import create_engine
from service.store.retention import sweep
from tests.api_helpers import client_for, wait_until_terminal
from tests.conftest import ServerProcess
from tests.faults import doctor

ServerFactory = Callable[..., ServerProcess]

HORIZON_SECONDS = 4.0


def _count(database_url: str, sql: str) -> int:
    async def run() -> int:
        db = create_engine(database_url)
        try:
            async with db.connect() as connection:
                return int(await connection.scalar(sa.text(sql)) or 0)
        finally:
            await db.dispose()

    return asyncio.run(run())


def _gone(call: Callable[[], Any], timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            call()
        except openai.NotFoundError:
            return True
        time.sleep(0.2)
    return False


def test_sweeper_deletes_expired_responses_and_conversations_under_load(
    database_url: str, app_factory: ServerFactory
) -> None:
    server = app_factory(
        database_url,
        SERVICE_RETENTION_DAYS=str(HORIZON_SECONDS / 86_400),
        SERVICE_RETENTION_SWEEP_SECONDS="0.3",
        SERVICE_RETENTION_BATCH_SIZE="2",
    ).start()
    client = client_for(server.url)
    conversation = client.conversations.create(items=[{"type": "message", "role": "user", "content": "hello"}])
    on_conversation = client.responses.create(conversation=conversation.id, input="hi", max_output_tokens=4)
    plain = [client.responses.create(input=f"old {n}", max_output_tokens=3) for n in range(4)]
    background = client.responses.create(input="a longer one", max_output_tokens=40, background=True)

    # Load: new responses keep arriving while the sweeper works.
    stop, created, errors = threading.Event(), [], []

    def load() -> None:
        while not stop.is_set():
            try:
                created.append(client.responses.create(input="new", max_output_tokens=2).id)
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

    worker = threading.Thread(target=load)
    worker.start()
    try:
        assert _gone(lambda: client.conversations.retrieve(conversation.id))
        for response in [on_conversation, *plain]:
            assert _gone(functools.partial(client.responses.retrieve, response.id)), response.id
        assert _gone(lambda: client.responses.retrieve(background.id))
    finally:
        stop.set()
        worker.join()
    assert not errors, errors[:3]
    assert created
    fresh = client.responses.create(input="fresh", max_output_tokens=2)
    assert client.responses.retrieve(fresh.id).id == fresh.id  # inside the horizon: kept
    wait_until_terminal(client, fresh.id)
    server.stop()

    for rid in [on_conversation.id, background.id, *(r.id for r in plain), conversation.id]:
        for table, column in (("events", "response_id"), ("run_facts", "response_id"), ("runs", "response_id")):
            assert _count(database_url, f"SELECT COUNT(*) FROM {table} WHERE {column} = '{rid}'") == 0, (table, rid)
    assert (
        _count(database_url, f"SELECT COUNT(*) FROM conversation_entries WHERE conversation_id = '{conversation.id}'")
        == 0
    )
    report = doctor(database_url)
    assert report.returncode == 0, report.stdout + report.stderr


async def test_sweep_purges_compaction_state_past_the_horizon(db: AsyncEngine) -> None:
    kept = await compaction_state.save(db, project="p", summary=[{"type": "message"}], dropped=[])
    assert await compaction_state.load_summary(db, kept, project="p") == [{"type": "message"}]
    assert await compaction_state.load_summary(db, kept, project="q") is None  # another project's: not found
    assert (await sweep(db, retention_days=1, now=time.time())).compactions == 0
    swept = await sweep(db, retention_days=1, batch_size=1, now=time.time() + 2 * 86_400)
    assert swept.compactions == 1 and await compaction_state.load_summary(db, kept, project="p") is None
    # created once (migration 0004)
    assert await compaction_state.stored_key(db) == await compaction_state.stored_key(db)
