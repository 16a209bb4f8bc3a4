"""Nothing is left behind: store=false runs whose client left, cancel racing DELETE; and
`python -m service doctor`, which checks the log's invariants over a whole database."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import sqlalchemy as sa

from service.store.db import create_engine
from tests.api_helpers import client_for, sql_rows, wait_until_terminal
from tests.conftest import ServerProcess
from tests.faults import doctor

ServerFactory = Callable[..., ServerProcess]
TABLES = ("events", "run_facts", "runs", "conversation_items")


def _rows_of(database_url: str, response_id: str) -> dict[str, int]:
    counts = {
        table: sql_rows(database_url, f"SELECT count(*) FROM {table} WHERE response_id = :id", id=response_id)[0][0]
        for table in TABLES
    }
    counts["responses"] = sql_rows(database_url, "SELECT count(*) FROM responses WHERE id = :id", id=response_id)[0][0]
    return counts


def test_store_false_is_gone_when_its_client_leaves(database_url: str, app_factory: ServerFactory) -> None:
    server = app_factory(database_url).start()
    body = {"input": "forget me", "max_output_tokens": 2000, "store": False, "stream": True}
    response_id = None
    with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=60) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[len("data: ") :])
                response_id = response_id or event["response"]["id"]
                if event["sequence_number"] >= 5:
                    break  # the client leaves mid-stream
    assert response_id is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_rows_of(database_url, response_id).values()):
        time.sleep(0.2)
    assert _rows_of(database_url, response_id) == dict.fromkeys((*TABLES, "responses"), 0)
    result = doctor(database_url)
    assert result.returncode == 0, result.stdout + result.stderr


def test_cancel_racing_delete_leaves_no_orphans(database_url: str, app_factory: ServerFactory) -> None:
    server = app_factory(database_url).start()
    client = client_for(server.url)
    ids = [client.responses.create(input=f"race {i}", max_output_tokens=500, background=True).id for i in range(6)]
    threads = []
    for response_id in ids:
        url = f"{server.url}/v1/responses/{response_id}"
        for method, target in (("POST", url + "/cancel"), ("DELETE", url)):
            threads.append(threading.Thread(target=httpx.request, args=(method, target), kwargs={"timeout": 60}))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    for response_id in ids:
        assert _rows_of(database_url, response_id) == dict.fromkeys((*TABLES, "responses"), 0)
    result = doctor(database_url)
    assert result.returncode == 0, result.stdout + result.stderr


def test_doctor_finds_a_gap_and_an_orphan(database_url: str, app_factory: ServerFactory) -> None:
    server = app_factory(database_url).start()
    client = client_for(server.url)
    first = client.responses.create(input="one", max_output_tokens=20)
    second = client.responses.create(input="two", max_output_tokens=20, background=True)
    wait_until_terminal(client, second.id)
    clean = doctor(database_url)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert clean.stdout.strip().startswith("ok: 2 responses, ")
    server.stop()

    sql_rows(database_url, "DELETE FROM events WHERE response_id = :id AND sequence_number = 3", id=first.id)
    sql_rows(
        database_url,
        "INSERT INTO run_facts (response_id, kind, data, created_at) VALUES ('resp_orphan', 'cancel_requested', '{}', "
        ":now)",
        now=datetime.now(UTC),
    )
    broken = doctor(database_url)
    assert broken.returncode == 1
    assert f"{first.id}: sequence numbers are not" in broken.stdout
    assert "resp_orphan: orphan rows in run_facts" in broken.stdout
    assert second.id not in broken.stdout


async def test_an_idle_checkpoint_truncates_the_sqlite_wal(tmp_path: Any) -> None:
    from service.store.db import checkpoint_when_idle, migrate

    path = tmp_path / "wal.db"
    url = f"sqlite+aiosqlite:///{path}"
    await migrate(url)
    db = create_engine(url)
    try:
        async with db.begin() as connection:
            rows = [{"data": "x" * 500, "now": datetime.now(UTC)} for _ in range(2000)]
            await connection.execute(
                sa.text("INSERT INTO run_facts (response_id, kind, data, created_at) VALUES ('r', 'k', :data, :now)"),
                rows,
            )
        wal = path.with_name(path.name + "-wal")
        assert wal.stat().st_size > 100_000
        await checkpoint_when_idle(db)
        assert wal.stat().st_size == 0
        async with db.connect() as connection:
            assert await connection.scalar(sa.text("SELECT count(*) FROM run_facts")) == 2000
    finally:
        await db.dispose()
