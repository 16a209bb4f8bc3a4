"""Where a run stands in its agent loop: pure bookkeeping, rebuilt from the log like everything else.

A response with server-side tool calls is generated in segments. Segment 0 starts from the prompt; each
call's result ends a segment, and the next one starts from the previous segment's prompt plus its sampled
tokens plus the result's tokens (`harmony_tools.tool_result_tokens`), with a fresh parser and constraint.
Replaying the same facts always rebuilds the same segment, so a resumed run continues token-identically.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from service.agent.calls import ToolCalls


@dataclass
class Segment:
    prompt: list[int]  # the engine sequence's prompt for the current segment
    tokens: list[int] = field(default_factory=list)  # sampled in the current segment
    generated_before: int = 0  # sampled in earlier segments (they count against max_output_tokens)
    calls_made: int = 0  # calls with a logged result
    calls: ToolCalls | None = None

    def next_segment(self, result_tokens: list[int]) -> None:
        self.prompt = self.prompt + self.tokens + result_tokens
        self.generated_before += len(self.tokens)
        self.tokens = []
        self.calls_made += 1


def segment_constraint_spec(spec: dict[str, Any] | None, calls_made: int) -> dict[str, Any] | None:
    """The constraint fact of a later segment: a forced tool_choice was satisfied by the first call, and
    `max_tool_calls` counts what is left (0: the model can only answer)."""
    if spec is None or calls_made == 0:
        return spec
    choice = spec.get("tool_choice")
    limit = spec.get("max_tool_calls")
    return {
        **spec,
        "tool_choice": "none" if choice == "none" else "auto",
        "max_tool_calls": None if limit is None else max(limit - calls_made, 0),
    }
