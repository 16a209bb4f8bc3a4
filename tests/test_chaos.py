"""Chaos: concurrent background runs, repeated kill -9 / restart at random moments and, with
store faults, database outages (PostgreSQL connections cut by a proxy, or SQLite's write lock
held by another process) in between; then every run is checked against the log's invariants and
`python -m service doctor` checks the whole database. Bounded in CI; larger runs from the
command line:

    .venv/bin/python -m tests.test_chaos --runs 20 --kills 10 --store-faults \
        --database-url postgresql+asyncpg://postgres@127.0.0.1/test
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import make_url

from service.projection import project
from tests.api_helpers import client_for, raw_events, text_from_deltas, wait_until_terminal
from tests.conftest import ServerProcess
from tests.faults import FaultProxy, SQLiteLocker, doctor

TERMINAL = ("response.completed", "response.incomplete", "response.failed")


def run_chaos(
    database_url: str, *, runs: int, kills: int, seed: int, log_dir: Path, store_faults: bool = False
) -> dict[str, Any]:
    rng = random.Random(seed)
    started: list[ServerProcess] = []
    faults = _StoreFaults(database_url, log_dir) if store_faults else None
    server_url = faults.server_database_url if faults else database_url

    def start() -> ServerProcess:
        server = ServerProcess(server_url, log_dir / f"chaos-server-{len(started)}.log", SERVICE_MAX_ACTIVE_RUNS="4")
        started.append(server)
        return server.start()

    try:
        server = start()
        client = client_for(server.url)
        ids = [
            client.responses.create(
                input=f"chaos run {n}", background=True, max_output_tokens=rng.randint(60, 300), extra_body={"seed": n}
            ).id
            for n in range(runs)
        ]
        cancelled = ids[:: max(1, runs // 3)][:2]
        for cycle in range(kills):
            time.sleep(rng.uniform(0.2, 1.5))
            if faults is not None:
                faults.inject(rng.uniform(0.5, 3.0))
                time.sleep(rng.uniform(0.1, 1.0))
            if cycle == 1:
                for response_id in cancelled:  # some cancels land between crashes
                    client.with_options(timeout=60, max_retries=8).responses.cancel(response_id)  # 503 in an outage
            server.kill()
            server = start()
            client = client_for(server.url)
        if faults is not None:
            faults.settle()
        report = _verify(server, client, ids, cancelled)
    finally:
        for each in started:
            each.stop()
        if faults is not None:
            faults.close()
    checked = doctor(database_url)
    if checked.returncode != 0:
        report["violations"].append(f"doctor: {checked.stdout.strip()} {checked.stderr.strip()}")
    injected = faults.injected if faults else 0
    return {"runs": runs, "kills": kills, "restarts": len(started) - 1, "store_faults": injected, **report}


class _StoreFaults:
    """Outages of the store between crashes: a proxy in front of PostgreSQL, a lock on SQLite."""

    def __init__(self, database_url: str, log_dir: Path) -> None:
        self.injected = 0
        self._sqlite_path: Path | None = None
        self._proxy: FaultProxy | None = None
        self._lockers: list[SQLiteLocker] = []
        url = make_url(database_url)
        if url.get_backend_name() == "sqlite":
            self._sqlite_path = Path(str(url.database))
            self.server_database_url = database_url
        else:
            self._proxy = FaultProxy(url.host or "127.0.0.1", url.port or 5432).start()
            proxied = url.set(host="127.0.0.1", port=self._proxy.port)
            self.server_database_url = proxied.render_as_string(hide_password=False)

    def inject(self, seconds: float) -> None:
        self.injected += 1
        if self._proxy is not None:
            self._proxy.cut(seconds)
        else:
            assert self._sqlite_path is not None
            self._lockers.append(SQLiteLocker(self._sqlite_path, seconds))

    def settle(self) -> None:
        for locker in self._lockers:
            locker.wait()
        while self._proxy is not None and self._proxy.down:
            time.sleep(0.1)

    def close(self) -> None:
        self.settle()
        if self._proxy is not None:
            self._proxy.stop()


def _verify(server: ServerProcess, client: Any, ids: list[str], cancelled: list[str]) -> dict[str, Any]:
    """Every run: contiguous sequence numbers, one terminal event last, stored projection equal to
    the fold of its log, text equal to its deltas."""
    violations: list[str] = []
    events_checked = 0
    for response_id in ids:
        wait_until_terminal(client, response_id, timeout=300)
        final = httpx.get(f"{server.url}/v1/responses/{response_id}").json()  # raw JSON, as stored
        events = raw_events(server.url, response_id)
        events_checked += len(events)
        numbers = [e["sequence_number"] for e in events]
        if numbers != list(range(len(events))):
            violations.append(f"{response_id}: sequence numbers not contiguous")
        terminals = [e for e in events if e["type"] in TERMINAL]
        if len(terminals) != 1 or events[-1] is not terminals[0]:
            violations.append(f"{response_id}: {len(terminals)} terminal events")
        if project(events) != final:
            violations.append(f"{response_id}: stored projection differs from the fold of its log")
        message_text = "".join(p["text"] for i in final["output"] if i["type"] == "message" for p in i["content"])
        if message_text != text_from_deltas(events):
            violations.append(f"{response_id}: text differs from its deltas")
        if response_id in cancelled and final["status"] not in ("cancelled", "completed", "incomplete"):
            violations.append(f"{response_id}: cancelled run ended {final['status']}")
    return {"events_checked": events_checked, "cancelled": len(cancelled), "violations": violations}


@pytest.mark.slow
@pytest.mark.parametrize("store_faults", [False, True], ids=["crashes", "crashes+store-faults"])
def test_chaos_kill_9_restart_cycles(
    database_url: str, random_model_dir: Path, tmp_path: Path, store_faults: bool
) -> None:
    report = run_chaos(database_url, runs=6, kills=4, seed=7, log_dir=tmp_path, store_faults=store_faults)
    print("chaos report:", json.dumps(report))
    assert report["violations"] == []
    assert report["events_checked"] > report["runs"] * 3
    assert report["store_faults"] == (4 if store_faults else 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--store-faults", action="store_true", help="also cut the store between crashes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.database_url or f"sqlite+aiosqlite:///{tmp}/chaos.db"
        report = run_chaos(
            url, runs=args.runs, kills=args.kills, seed=args.seed, log_dir=Path(tmp), store_faults=args.store_faults
        )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
