"""What every server-side tool is: an async `call(name, arguments, idempotency_key) -> ToolResult`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class ToolResult:
    """A tool's answer: `output` when it worked, `error` (shown to the model and the client) when not."""

    output: str | None
    error: str | None = None
    # Tool-specific extras kept with the result (e.g. the code interpreter's logs and exit status).
    details: dict[str, Any] | None = None

    def as_fact(self) -> dict[str, Any]:
        return {"output": self.output, "error": self.error, **({"details": self.details} if self.details else {})}

    @classmethod
    def from_fact(cls, data: dict[str, Any]) -> ToolResult:
        return cls(output=data.get("output"), error=data.get("error"), details=data.get("details"))


class ServerTool(Protocol):
    """Runs on this server. Knows nothing about HTTP or the log; the idempotency key is the same when a
    call interrupted by a crash is retried, so a tool that honours it acts once."""

    async def call(self, name: str, arguments: str, idempotency_key: str) -> ToolResult: ...


class SearchProvider(Protocol):
    """What an operator plugs in to offer `web_search_preview` (none ships: these machines have no web)."""

    async def search(self, query: str, idempotency_key: str) -> ToolResult: ...
