"""The agent loop inside the run supervisor: a run whose model called a server-side tool leaves the
engine, its call is executed exactly once per log (service/agent/calls.py), the result is logged with its
events, and the run goes back into the engine with the result in its prompt (service/agent/segment.py).

Nothing here touches the engine or the database directly: the supervisor passes `commit` (append one
write and return once it is committed) and takes the run back when `run_call` returns. The tools
themselves (MCP connector, sandbox, containers, secrets) are the `ToolRuntime` the server was built with.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from service.agent import calls
from service.agent.items import container_id
from service.agent.runtime import ToolRuntime
from service.agent.segment import Segment
from service.log.facts import RequestFact
from service.prompting import harmony_tools
from service.prompting.base import ChatFormat
from service.store.recorder import RunWrite
from service.store.schema import DEFAULT_PROJECT
from service.tools import secrets
from service.tools.base import ToolResult
from service.tools.code_interpreter import CodeInterpreter
from service.tools.registry import McpServerTool, ToolRegistry, allowed_tool_names

Commit = Callable[[RunWrite], Awaitable[bool]]  # True once committed; False: the run is no longer ours


class RunLost(Exception):
    """The run's write was refused: another worker owns it now, or it was deleted."""


class CallBuilder(Protocol):
    """What executing a call needs of the run's stream builder (service/stream_builder.py's StreamBuilder)."""

    @property
    def pending_call(self) -> dict[str, Any] | None:
        """The server-side call awaiting its result, as its item's JSON."""
        ...

    def tool_result(
        self, output: str | None, error: str | None, details: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        """The pending call returned: its item's closing events."""
        ...


class RunAtCall(Protocol):
    """What executing a run's call needs of the run (service/runs/state.py's ActiveRun)."""

    @property
    def response_id(self) -> str: ...

    @property
    def fact(self) -> RequestFact: ...

    @property
    def builder(self) -> CallBuilder: ...

    @property
    def segment(self) -> Segment | None: ...

    def write(self) -> RunWrite:
        """A write of the run's events not yet logged."""
        ...

    def record(self, write: RunWrite, new_events: list[dict[str, Any]]) -> None:
        """Add new events (folded into the run's projection) to `write`."""
        ...


def result_tokens_for(chat_format: ChatFormat) -> Callable[[str, str, str | None, str | None], list[int]]:
    """A call's result (its output, or its error) as the tokens that continue the run, in the format's own
    rendering (`ChatFormat.server_tool_result_tokens`); a pure function of the result."""

    def result_tokens(namespace: str, name: str, output: str | None, error: str | None) -> list[int]:
        return chat_format.server_tool_result_tokens(namespace, name, harmony_tools.result_text(output, error))

    return result_tokens


@dataclass(frozen=True)
class _Unavailable:
    """A server whose call cannot be made here (its secrets are not readable): the call's error says why."""

    reason: str

    async def call(self, name: str, arguments: str, idempotency_key: str) -> ToolResult:
        return ToolResult(None, self.reason)


class ToolSteps:
    """Executes runs' server-side tool calls with the server's `tools`; results continue in `chat_format`."""

    def __init__(self, tools: ToolRuntime, chat_format: ChatFormat) -> None:
        self.tools = tools
        self.result_tokens = result_tokens_for(chat_format)

    def registry(self, run: RunAtCall) -> ToolRegistry:
        registry = ToolRegistry()
        tools: list[dict[str, Any]] = run.fact.response.get("tools") or []
        for spec in tools:
            if spec.get("type") == "code_interpreter":
                registry.add("python", self._interpreter(run, container_id(run.response_id, tools)))
            elif spec.get("type") == "mcp":
                label = spec["server_label"]
                try:
                    headers = self._headers(run, label)
                except secrets.SecretsUnreadable as exc:
                    registry.add(label, _Unavailable(str(exc)))  # never call out without the client's secrets
                    continue
                registry.add(
                    label, McpServerTool(self.tools.connector, spec["server_url"], headers, allowed_tool_names(spec))
                )
        return registry

    def _interpreter(self, run: RunAtCall, container: str) -> CodeInterpreter:
        """Runs in the container only if it is still the run's project's (checked when the code runs)."""
        project = run.fact.project or DEFAULT_PROJECT
        containers = self.tools.containers

        async def open_container() -> str | None:
            assert containers is not None
            return await containers.open_for_run(container, project=project, response_id=run.response_id)

        return CodeInterpreter(
            self.tools.sandbox, container, tenant=project, open_container=None if containers is None else open_container
        )

    def _headers(self, run: RunAtCall, label: str) -> dict[str, str]:
        remembered = self.tools.secrets.get(run.response_id, label)
        if remembered is not None:
            return remembered
        sealed = (run.fact.sealed_secrets or {}).get(label)
        if sealed is not None:
            return secrets.request_headers(secrets.unseal(self.tools.settings.secret_key, sealed))
        if label in (run.fact.mcp_secret_labels or []):
            raise secrets.SecretsUnreadable(
                f"The secrets of MCP server '{label}' were kept in the memory of the process that accepted this "
                "request, which no longer runs it; set SERVICE_SECRET_KEY so that any replica can use them."
            )
        return {}

    def forget(self, response_id: str) -> None:
        """The run has ended here: its secrets are dropped."""
        self.tools.secrets.pop(response_id)

    async def run_call(self, run: RunAtCall, commit: Commit) -> None:
        """Execute the run's pending call (or reuse its logged result) and log the result with its events;
        then the run's segment holds the continuation's prompt."""
        item = run.builder.pending_call
        assert item is not None and run.segment is not None and run.segment.calls is not None
        namespace = "python" if item["type"] == "code_interpreter_call" else item["server_label"]
        name = item.get("name", "")
        body = item["code"] if item["type"] == "code_interpreter_call" else item["arguments"]
        call = calls.PlannedCall(run.segment.calls_made, namespace, name, body)

        async def log_fact(kind: str, data: dict[str, Any]) -> None:
            write = run.write()
            write.facts.append((kind, data))
            if kind == calls.RESULT:
                run.record(write, run.builder.tool_result(data.get("output"), data.get("error"), data.get("details")))
            if not await commit(write):
                raise RunLost(run.response_id)

        registry = self.registry(run)
        result = await calls.execute(
            run.segment.calls, call, registry, log_fact, timeout_seconds=self.tools.settings.tool_timeout_seconds
        )
        # Off the event loop: a long output takes a while to tokenize (in bounded calls that let the loop run).
        tokens = await asyncio.to_thread(self.result_tokens, namespace, name, result.output, result.error)
        run.segment.next_segment(tokens)
