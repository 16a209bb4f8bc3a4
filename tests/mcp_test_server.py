"""A real MCP server for the tests: MCPServer over streamable HTTP on loopback, counting its calls.

Run as `python -m tests.mcp_test_server PORT LEDGER`: every tool call appends one JSON line
`{"tool", "arguments", "idempotency_key", "authorization"}` to LEDGER, so a test (or a restarted service)
can count calls and see the idempotency keys they carried.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any, Literal

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

IDEMPOTENCY_META_KEY = "io.github.service/idempotency-key"


def build(ledger: Path) -> MCPServer:
    server = MCPServer("counter", log_level="WARNING")

    def record(tool: str, arguments: dict[str, Any], ctx: Context) -> None:
        meta = ctx.request_context.meta or {}
        headers = ctx.headers or {}
        line = {
            "tool": tool,
            "arguments": arguments,
            "idempotency_key": dict(meta).get(IDEMPOTENCY_META_KEY),
            "authorization": headers.get("authorization"),
        }
        with ledger.open("a") as handle:
            handle.write(json.dumps(line) + "\n")

    @server.tool()
    def add(a: int, b: int, ctx: Context) -> str:
        """Add two integers."""
        record("add", {"a": a, "b": b}, ctx)
        return str(a + b)

    @server.tool()
    def pick(color: Literal["red", "green", "blue"], ctx: Context) -> str:
        """Pick a color (a bounded argument: even a random-weight model's call is short)."""
        record("pick", {"color": color}, ctx)
        return f"picked {color}"

    @server.tool()
    async def nap(ctx: Context) -> str:
        """Take a few seconds, with no arguments (a random-weight model's call to it is `{}`)."""
        record("nap", {}, ctx)
        await asyncio.sleep(4)
        return "rested"

    @server.tool()
    def echo(text: str, ctx: Context) -> str:
        """Repeat the text."""
        record("echo", {"text": text}, ctx)
        return text

    @server.tool()
    def shout(text: str, ctx: Context) -> str:
        """Upper-case the text (never allowed in the allowed_tools tests)."""
        record("shout", {"text": text}, ctx)
        return text.upper()

    @server.tool()
    async def slow(seconds: float, ctx: Context) -> str:
        """Sleep, then answer."""
        record("slow", {"seconds": seconds}, ctx)
        await asyncio.sleep(seconds)
        return f"slept {seconds}"

    @server.tool()
    def fail(reason: str, ctx: Context) -> str:
        """Always raise."""
        record("fail", {"reason": reason}, ctx)
        raise ValueError(reason)

    @server.tool()
    def deny(ctx: Context) -> str:
        """Refuse, quoting the caller's credentials (a careless server: its error holds the client's secret)."""
        record("deny", {}, ctx)
        raise ToolError(f"access denied for {(ctx.headers or {}).get('authorization')}")

    return server


def read_ledger(ledger: Path) -> list[dict[str, Any]]:
    if not ledger.exists():
        return []
    return [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()]


def main() -> None:
    port, ledger = int(sys.argv[1]), Path(sys.argv[2])
    app = build(ledger).streamable_http_app(stateless_http=True, json_response=True)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
