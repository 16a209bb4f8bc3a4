"""The agent loop's tool-call bookkeeping: a pure state machine over logged facts, and the one place a
server-side tool is executed.

Facts (in `run_facts`, beside a run's `tokens`):
- `tool_call_started` {"index", "namespace", "name", "arguments", "idempotency_key"}: logged (committed)
  before the call leaves this process;
- `tool_call_result` {"index", "output", "error", "details"?}: logged when it returns.

Replaying a run's facts through `ToolCalls.from_facts` tells, for the call at each index, what to do:
- a logged result is reused: the tool is never called again, and the continuation is the same tokens;
- started but no result (the process died while the call was in flight): call again, once, with the same
  idempotency key (at-least-once for such calls; exactly once for a tool that honours the key);
- otherwise: log `started`, then call.
Calls past `max_tool_calls` are not made; their result is an error the model sees.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from service.log.facts import ToolCallResult, ToolCallStarted, decode_as, fact_data
from service.store.event_log import TOOL_FACT_KINDS, StoredFact
from service.tools.base import ToolResult
from service.tools.registry import ToolRegistry

# The fact kinds are the store's (it reads them to tell whether a tool fact landed): one spelling.
STARTED, RESULT = TOOL_FACT_KINDS

LogFact = Callable[[str, dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class PlannedCall:
    index: int
    namespace: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Decision:
    action: Literal["reuse", "retry", "start", "refuse"]
    idempotency_key: str
    result: ToolResult | None = None


def tool_facts(facts: list[StoredFact]) -> list[tuple[int, str, dict[str, Any]]]:
    """A run's tool facts as (`tokens` facts logged before it, kind, data), for replay (runs.state.replay_run)."""
    out: list[tuple[int, str, dict[str, Any]]] = []
    tokens = 0
    for stored_fact in facts:
        if stored_fact.kind == "tokens":
            tokens += 1
        elif stored_fact.kind in (STARTED, RESULT):
            out.append((tokens, stored_fact.kind, stored_fact.data))
    return out


def idempotency_key(response_id: str, index: int) -> str:
    """Stable across restarts: the same run's call at the same index always carries the same key."""
    return f"{response_id}:tool:{index}"


@dataclass
class ToolCalls:
    response_id: str
    max_calls: int
    started: dict[int, ToolCallStarted] = field(default_factory=dict)
    results: dict[int, ToolResult] = field(default_factory=dict)

    @classmethod
    def from_facts(cls, response_id: str, max_calls: int, facts: Iterable[tuple[str, dict[str, Any]]]) -> ToolCalls:
        calls = cls(response_id, max_calls)
        for kind, data in facts:
            calls.apply(kind, data)
        return calls

    def apply(self, kind: str, data: dict[str, Any]) -> None:
        """Replay one stored tool fact (`run_facts` kind and data)."""
        if kind == STARTED:
            self.record(decode_as(ToolCallStarted, data))
        elif kind == RESULT:
            self.record(decode_as(ToolCallResult, data))

    def record(self, fact: ToolCallStarted | ToolCallResult) -> None:
        if isinstance(fact, ToolCallStarted):
            self.started[fact.index] = fact
        else:
            self.results[fact.index] = ToolResult(fact.output, fact.error, fact.details)

    def decide(self, call: PlannedCall) -> Decision:
        key = idempotency_key(self.response_id, call.index)
        if call.index in self.results:
            return Decision("reuse", key, self.results[call.index])
        logged = self.started.get(call.index)
        if logged is not None:
            if (logged.namespace, logged.name, logged.arguments) != (
                call.namespace,
                call.name,
                call.arguments,
            ):
                raise ValueError(f"call {call.index} of {self.response_id} differs from the logged one")
            return Decision("retry", key)
        if call.index >= self.max_calls:
            return Decision("refuse", key, ToolResult(None, f"max_tool_calls ({self.max_calls}) reached."))
        return Decision("start", key)


async def execute(
    calls: ToolCalls,
    call: PlannedCall,
    registry: ToolRegistry,
    log_fact: LogFact,
    *,
    timeout_seconds: float,
) -> ToolResult:
    """Run one call exactly once per log: `log_fact` must return only once the fact is committed."""
    decision = calls.decide(call)
    if decision.result is not None:
        if decision.action == "refuse":
            await _log_result(calls, call, decision.result, log_fact)
        return decision.result
    if decision.action == "start":
        started = ToolCallStarted(
            index=call.index,
            namespace=call.namespace,
            name=call.name,
            arguments=call.arguments,
            idempotency_key=decision.idempotency_key,
        )
        await log_fact(STARTED, fact_data(started))
        calls.record(started)
    tool = registry.get(call.namespace)
    if tool is None:
        result = ToolResult(None, f"No server-side tool '{call.namespace}' in this request.")
    else:
        try:
            result = await asyncio.wait_for(
                tool.call(call.name, call.arguments, decision.idempotency_key), timeout=timeout_seconds
            )
        except TimeoutError:
            result = ToolResult(None, f"The tool call timed out after {timeout_seconds:g}s.")
    await _log_result(calls, call, result, log_fact)
    return result


async def _log_result(calls: ToolCalls, call: PlannedCall, result: ToolResult, log_fact: LogFact) -> None:
    fact = ToolCallResult(index=call.index, output=result.output, error=result.error, details=result.details)
    await log_fact(RESULT, fact_data(fact))
    calls.record(fact)
