"""Bytes of log per generated token, live and after log compaction, on SQLite (file pages,
indexes included, after VACUUM) and PostgreSQL (`pg_total_relation_size` of events + run_facts).

    .venv/bin/python -m bench.log_size [--responses 10] [--tokens 500] [--database-url URL]

Runs the real server, creates `--responses` responses of up to `--tokens` tokens (ignore_eos is not
available: short answers end early; the figures are per generated token), measures, lets the
server's sweeper compact the finished streams into token records (replay window 0), and measures again.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from service.store.db import create_engine, is_sqlite
from tests.api_helpers import client_for
from tests.conftest import ServerProcess


def log_bytes(database_url: str) -> int:
    if is_sqlite(database_url):
        path = make_url(database_url).database
        assert path
        with sqlite3.connect(path) as connection:
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            connection.execute("VACUUM")
            # dbstat is not compiled into every SQLite: count the pages of the two log tables and their indexes.
            try:
                rows = connection.execute(
                    "SELECT SUM(pgsize) FROM dbstat WHERE name IN "
                    "('events', 'run_facts', 'sqlite_autoindex_events_1', 'ix_run_facts_response_id')"
                ).fetchone()
                return int(rows[0])
            except sqlite3.OperationalError:
                page_size = connection.execute("PRAGMA page_size").fetchone()[0]
                return int(connection.execute("PRAGMA page_count").fetchone()[0]) * int(page_size)

    async def query() -> int:
        db = create_engine(database_url)
        try:
            # Deleted rows keep their space until VACUUM: measure the live rows, like SQLite's VACUUM above.
            async with db.connect() as connection:
                autocommit = await connection.execution_options(isolation_level="AUTOCOMMIT")
                await autocommit.execute(sa.text("VACUUM FULL events"))
                await autocommit.execute(sa.text("VACUUM FULL run_facts"))
            async with db.connect() as connection:
                sql = "SELECT pg_total_relation_size('events') + pg_total_relation_size('run_facts')"
                return int(await connection.scalar(sa.text(sql)) or 0)
        finally:
            await db.dispose()

    return asyncio.run(query())


def counts(database_url: str) -> tuple[int, int, int, int]:
    async def query() -> tuple[int, int, int, int]:
        db = create_engine(database_url)
        try:
            async with db.connect() as connection:
                events = int(await connection.scalar(sa.text("SELECT COUNT(*) FROM events")) or 0)
                facts = int(await connection.scalar(sa.text("SELECT COUNT(*) FROM run_facts")) or 0)
                tokens = int(await connection.scalar(sa.text("SELECT SUM(output_tokens) FROM responses")) or 0)
                sql = "SELECT COUNT(*) FROM run_facts WHERE kind IN ('token_record', 'not_compactable')"
                records = int(await connection.scalar(sa.text(sql)) or 0)
                return events, facts, tokens, records
        finally:
            await db.dispose()

    return asyncio.run(query())


def measure(database_url: str, responses: int, tokens: int, log_dir: Path) -> None:
    server = ServerProcess(database_url, log_dir / "live.log", SERVICE_LOG_COMPACTION_GRACE_SECONDS="86400").start()
    client = client_for(server.url)
    for n in range(responses):
        client.responses.create(input=f"Write a long story about the number {n}.", max_output_tokens=tokens)
    server.stop()
    events, facts, generated, _ = counts(database_url)
    live = log_bytes(database_url)
    print(f"{database_url.split(':')[0]}: {responses} responses, {generated} generated tokens")
    print(f"  live:      {events} events + {facts} facts, {live} bytes, {live / generated:.0f} bytes/token")
    server = ServerProcess(
        database_url,
        log_dir / "compact.log",
        SERVICE_LOG_COMPACTION_GRACE_SECONDS="0",
        SERVICE_REPLAY_WINDOW_SECONDS="0",
        SERVICE_RETENTION_SWEEP_SECONDS="0.2",
    ).start()
    deadline = time.monotonic() + 120
    while counts(database_url)[3] < responses and time.monotonic() < deadline:
        time.sleep(0.2)
    server.stop()
    events, facts, _, _ = counts(database_url)
    compacted = log_bytes(database_url)
    print(f"  compacted: {events} events + {facts} facts, {compacted} bytes, {compacted / generated:.0f} bytes/token")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--database-url", action="append")
    parser.add_argument("--responses", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        urls = args.database_url or [f"sqlite+aiosqlite:///{Path(tmp) / 'log_size.db'}"]
        for url in urls:
            measure(url, args.responses, args.tokens, Path(tmp))


if __name__ == "__main__":
    main()
