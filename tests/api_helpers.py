"""Helpers shared by the end-to-end tests (real server, official openai client)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from openai import OpenAI

# Server settings under which a finished response's stream is archived (stream_archive) within a second.
COMPACT_AT_ONCE = {
    "SERVICE_LOG_COMPACTION_GRACE_SECONDS": "0",
    "SERVICE_REPLAY_WINDOW_SECONDS": "0",
    "SERVICE_RETENTION_SWEEP_SECONDS": "0.2",
}


def client_for(url: str) -> OpenAI:
    return OpenAI(base_url=url + "/v1", api_key="test-key", max_retries=0, timeout=120)


def wait_until_terminal(client: OpenAI, response_id: str, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        response = client.responses.retrieve(response_id)
        if response.status in ("completed", "incomplete", "failed", "cancelled"):
            return response
        time.sleep(0.1)
    raise AssertionError(f"{response_id} did not finish in {timeout}s")


def raw_events(url: str, response_id: str, after: int = -1) -> list[dict[str, Any]]:
    """The whole stream of a response as replayed by the server (sequence_number > after)."""
    import json

    events = []
    with httpx.stream(
        "GET", f"{url}/v1/responses/{response_id}", params={"stream": "true", "starting_after": after}, timeout=120
    ) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: ") :]))
    return events


def assert_well_formed_stream(events: list[dict[str, Any]], first: int = 0) -> None:
    """Contiguous sequence numbers, exactly one terminal event, and it is the last."""
    numbers = [e["sequence_number"] for e in events]
    assert numbers == list(range(first, first + len(events))), numbers
    terminals = [e for e in events if e["type"] in ("response.completed", "response.incomplete", "response.failed")]
    assert len(terminals) == 1 and events[-1] is terminals[0], [e["type"] for e in events][-5:]


def text_from_deltas(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


def final_text(response: dict[str, Any]) -> str:
    return "".join(part["text"] for item in response["output"] if item["type"] == "message" for part in item["content"])


def sql_rows(database_url: str, statement: str, **params: Any) -> list[tuple[Any, ...]]:
    """Run one SQL statement on the service's database (in its own transaction) and return its rows."""
    import sqlalchemy as sa

    from service.store.db import create_engine

    async def run() -> list[tuple[Any, ...]]:
        db = create_engine(database_url)
        try:
            async with db.begin() as connection:
                result = await connection.execute(sa.text(statement), params)
                return [tuple(row) for row in result] if result.returns_rows else []
        finally:
            await db.dispose()

    return asyncio.run(run())
