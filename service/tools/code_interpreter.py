"""The `code_interpreter` tool: the model's Python runs in the sandbox, in its container's work directory."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from service.tools.base import ToolResult
from service.tools.sandbox import Sandbox

# Checks, when the code is about to run, that the container is still the run's to use: None, or why not.
OpenContainer = Callable[[], Awaitable[str | None]]


@dataclass
class CodeInterpreter:
    sandbox: Sandbox
    container_id: str
    tenant: str = "default"  # the project that owns the container
    open_container: OpenContainer | None = None

    async def call(self, name: str, arguments: str, idempotency_key: str) -> ToolResult:
        """`arguments` is the code itself (Harmony's `python` tool writes plain code)."""
        if self.open_container is not None:
            refused = await self.open_container()
            if refused is not None:
                return ToolResult(None, refused)
        result = await self.sandbox.run(self.container_id, arguments, tenant=self.tenant)
        # A traceback or a kill is output the model should see (and may fix), not a tool failure.
        details = {"exit_code": result.exit_code, "timed_out": result.timed_out}
        return ToolResult(output=result.logs, details=details)
