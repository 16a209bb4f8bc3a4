"""GET latency under load: 16 streaming runs generate while a client retrieves a finished
response again and again. Prints p50/p95/max of GET /v1/responses/{id} on SQLite and PostgreSQL
(readers must not queue behind the writer on either store).

    .venv/bin/python -m bench.get_latency [--streams 16] [--gets 300] [--postgres-url postgresql+asyncpg://...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.api_helpers import client_for
from tests.conftest import _PG_SKIP_REASON, ServerProcess, create_postgres_database, drop_postgres_database


def _stream(url: str, stop: threading.Event) -> None:
    body = {"input": "keep writing", "max_output_tokens": 4000, "stream": True}
    with httpx.stream("POST", f"{url}/v1/responses", json=body, timeout=300) as response:
        for _line in response.iter_lines():
            if stop.is_set():
                return


def measure(database_url: str, *, streams: int, gets: int, log_dir: Path) -> dict[str, Any]:
    server = ServerProcess(database_url, log_dir / "bench-server.log", SERVICE_MAX_ACTIVE_RUNS=str(streams)).start()
    try:
        target = client_for(server.url).responses.create(input="read me", max_output_tokens=20).id
        stop = threading.Event()
        threads = [threading.Thread(target=_stream, args=(server.url, stop), daemon=True) for _ in range(streams)]
        for thread in threads:
            thread.start()
        time.sleep(2.0)  # every stream generating
        latencies = []
        with httpx.Client(base_url=server.url, timeout=60) as http:
            for _ in range(gets):
                started = time.perf_counter()
                http.get(f"/v1/responses/{target}").raise_for_status()
                latencies.append((time.perf_counter() - started) * 1000)
        stop.set()
    finally:
        server.stop()
    latencies.sort()
    return {
        "streams": streams,
        "gets": gets,
        "p50_ms": round(statistics.median(latencies), 1),
        "p95_ms": round(latencies[int(0.95 * (len(latencies) - 1))], 1),
        "max_ms": round(latencies[-1], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--gets", type=int, default=300)
    args = parser.parse_args()
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        report["sqlite"] = measure(
            f"sqlite+aiosqlite:///{tmp}/bench.db", streams=args.streams, gets=args.gets, log_dir=Path(tmp)
        )
        if _PG_SKIP_REASON:
            report["postgresql"] = _PG_SKIP_REASON
        else:
            url, name = create_postgres_database()
            try:
                report["postgresql"] = measure(url, streams=args.streams, gets=args.gets, log_dir=Path(tmp))
            finally:
                drop_postgres_database(name)
    if isinstance(report.get("postgresql"), dict):
        report["sqlite_p95_over_postgresql_p95"] = round(
            report["sqlite"]["p95_ms"] / max(report["postgresql"]["p95_ms"], 0.1), 2
        )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
