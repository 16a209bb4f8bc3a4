"""Runs one MCP tool call through the agent loop against a real database, as its own process, so a test
can kill -9 it mid-call: `python -m tests.tools_loop_runner DATABASE_URL RESPONSE_ID SERVER_URL NAME ARGS`."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from service.agent.calls import PlannedCall, ToolCalls, execute
from service.store import event_log
from service.store.db import create_engine
from service.tools.mcp import McpConnector
from service.tools.registry import McpServerTool, ToolRegistry


async def run_call(db: AsyncEngine, response_id: str, server_url: str, name: str, arguments: str) -> str | None:
    """Replay the run's tool facts, then execute (or reuse) call 0; returns the output."""
    async with db.connect() as connection:
        facts = [(f.kind, f.data) for f in await event_log.read_facts(connection, response_id)]
    calls = ToolCalls.from_facts(response_id, max_calls=4, facts=facts)
    registry = ToolRegistry()
    registry.add("counter", McpServerTool(McpConnector(timeout_seconds=30, max_output_bytes=4096), server_url, {}))

    async def log_fact(kind: str, data: dict[str, Any]) -> None:
        async with db.begin() as connection:
            await event_log.append_fact(connection, response_id, kind, data)

    result = await execute(calls, PlannedCall(0, "counter", name, arguments), registry, log_fact, timeout_seconds=30)
    return result.output


async def main() -> None:
    database_url, response_id, server_url, name, arguments = sys.argv[1:6]
    db = create_engine(database_url)
    try:
        print(await run_call(db, response_id, server_url, name, arguments), flush=True)
    finally:
        await db.dispose()


if __name__ == "__main__":
    asyncio.run(main())
