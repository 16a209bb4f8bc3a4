"""The `code_interpreter` tool: the model's Python runs in the sandbox, in its container's work directory."""

from __future__ import annotations

from dataclasses import dataclass

from service.tools.base import ToolResult
from service.tools.sandbox import Sandbox


@dataclass
class CodeInterpreter:
    sandbox: Sandbox
    container_id: str

    async def call(self, name: str, arguments: str, idempotency_key: str) -> ToolResult:
        """`arguments` is the code itself (Harmony's `python` tool writes plain code)."""
        result = await self.sandbox.run(self.container_id, arguments)
        # A traceback or a kill is output the model should see (and may fix), not a tool failure.
        details = {"exit_code": result.exit_code, "timed_out": result.timed_out}
        return ToolResult(output=result.logs, details=details)
