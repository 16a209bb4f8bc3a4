"""Live tailing across replicas: two servers on one PostgreSQL database; one run streamed at the
same time from the replica that generates it and from the other one. Prints how much later each
event reaches the client of the other replica (LISTEN/NOTIFY path) than the owner's client.

    .venv/bin/python -m bench.replica_latency [--database-url postgresql+asyncpg://postgres@127.0.0.1/bench]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
import time
from pathlib import Path

import sqlalchemy as sa

from service.store.db import create_engine
from tests.api_helpers import client_for
from tests.conftest import ServerProcess


def _owner(database_url: str, response_id: str) -> str | None:
    async def query() -> str | None:
        db = create_engine(database_url)
        try:
            async with db.connect() as connection:
                sql = sa.text("SELECT owner FROM runs WHERE response_id = :id")
                owner: str | None = await connection.scalar(sql, {"id": response_id})
                return owner
        finally:
            await db.dispose()

    return asyncio.run(query())


def _receive(url: str, response_id: str, arrivals: dict[int, float]) -> None:
    for event in client_for(url).responses.retrieve(response_id, stream=True):
        arrivals[event.sequence_number] = time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--database-url", default="postgresql+asyncpg://postgres@127.0.0.1/bench")
    parser.add_argument("--tokens", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        servers = [ServerProcess(args.database_url, Path(tmp) / f"replica-{n}.log").start() for n in range(2)]
        try:
            client = client_for(servers[0].url)
            response = client.responses.create(input="latency", max_output_tokens=args.tokens, background=True)
            owner = None
            while owner is None:
                owner = _owner(args.database_url, response.id)
            pids = [str(server.process.pid) for server in servers if server.process]
            local, remote = (servers[0], servers[1]) if f"-{pids[0]}-" in owner else (servers[1], servers[0])
            local_arrivals: dict[int, float] = {}
            remote_arrivals: dict[int, float] = {}
            threads = [
                threading.Thread(target=_receive, args=(local.url, response.id, local_arrivals)),
                threading.Thread(target=_receive, args=(remote.url, response.id, remote_arrivals)),
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            for server in servers:
                server.stop()
    live = [n for n in local_arrivals if n in remote_arrivals and n > 5]
    lags = [(remote_arrivals[n] - local_arrivals[n]) * 1000 for n in live]
    print(f"events compared: {len(lags)}")
    print(
        f"other replica minus owner, ms: median {statistics.median(lags):.1f}, "
        f"p90 {statistics.quantiles(lags, n=10)[-1]:.1f}, max {max(lags):.1f}"
    )


if __name__ == "__main__":
    main()
