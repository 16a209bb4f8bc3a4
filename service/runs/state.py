"""A run's in-memory state, and how it is rebuilt from the log. Pure: no I/O.

Replaying the logged tokens through a fresh parser and StreamBuilder regenerates exactly the
events already logged (the builder is deterministic), so a claimer continues a run with the
next sequence number instead of storing the builder's state anywhere.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.agent import calls
from service.agent.segment import Segment
from service.engine.base import LogitsConstraint
from service.log.facts import RequestFact, TokensFact, ToolCallResult, decode_as
from service.projection import apply, project
from service.prompting.base import ChatFormat, ItemEnded, MalformedOutput, OutputParser, PartialTurn, PromptRequest
from service.protocol import TERMINAL_EVENT_TYPES
from service.store.recorder import RunWrite
from service.stream_builder import Ending, StreamBuilder

# (token facts before it, kind, data) of a run's `tool_call_started` / `tool_call_result` facts.
ToolFact = tuple[int, str, dict[str, Any]]
# Tokens that feed a call's result back to the model: (namespace, name, output, error) -> token ids.
ResultTokens = Callable[[str, str, str | None, str | None], list[int]]


class ReplayDiverged(RuntimeError):
    """Replaying the logged tokens did not reproduce the logged events."""


# Events after which the `responses` row is refreshed; deltas in between are folded by readers.
_ROW_REFRESH_EVENTS = TERMINAL_EVENT_TYPES | {"response.in_progress", "response.output_item.done"}


def prompt_request_from_fact(fact: RequestFact) -> PromptRequest:
    return PromptRequest(
        items=fact.prompt_items,
        instructions=fact.instructions,
        tools=tuple(fact.tools),
        reasoning_effort=fact.reasoning_effort,
    )


@dataclass
class ActiveRun:
    response_id: str
    fact: RequestFact
    builder: StreamBuilder
    parser: OutputParser
    projected: dict[str, Any]
    generated: int
    pending: list[dict[str, Any]] = field(default_factory=list)  # regenerated but not yet logged
    cancel_requested: bool = False
    token_facts: int = 0  # token ids logged or queued for this run (in `tokens` facts)
    segment: Segment | None = None  # the agent loop's position (service/agent/segment.py)
    constraint: LogitsConstraint | None = None  # the current segment's
    partial_turn: PartialTurn | None = None  # renders its next turn as it decodes (a continued conversation)
    delta_queued: bool = False  # a delta of this incarnation's output has been queued for commit

    @property
    def prompt_tokens(self) -> int:
        return len(self.fact.prompt_token_ids)

    def write(self) -> RunWrite:
        pending, self.pending = self.pending, []
        write = RunWrite(
            self.response_id,
            events=pending,
            output_ordinal_base=self.fact.input_item_count,
            token_facts_before=self.token_facts,
        )
        if any(e["type"] in _ROW_REFRESH_EVENTS for e in pending):
            # `projected` already folds the regenerated events (replay_run).
            write.projection, write.projection_through = copy.deepcopy(self.projected), pending[-1]
        return write

    def record(self, write: RunWrite, new_events: list[dict[str, Any]]) -> None:
        write.events += new_events
        self._fold(write, new_events)
        write.terminal = self.builder.finished

    def _fold(self, write: RunWrite, new_events: list[dict[str, Any]]) -> None:
        """Fold `new_events` into `projected`, snapshotting it for the row at the last refresh event among them:
        the row is stored with that event's position, and later events of the same write (or of steps merged
        into it before its commit) are folded by readers from the log."""
        last_refresh = max((i for i, e in enumerate(new_events) if e["type"] in _ROW_REFRESH_EVENTS), default=-1)
        for index, event in enumerate(new_events):
            self.projected = apply(self.projected, event)
            if index == last_refresh:
                write.projection, write.projection_through = copy.deepcopy(self.projected), event

    def record_joined(self, write: RunWrite, token_fact: dict[str, Any], new_events: list[dict[str, Any]]) -> None:
        """Record one step's token and events into `write`'s open group (queued, not yet committed)."""
        assert write.group_start is not None
        write.join_group(token_fact)
        # Folding only merges a leading delta and renumbers what follows it in place: a refresh event keeps
        # its identity, and the commit reads its final sequence number.
        self._fold(write, new_events)
        self.builder.fold_into(write.events, new_events, group_start=write.group_start)

    def finish(self, write: RunWrite, ending: Ending, error: dict[str, str] | None = None) -> None:
        try:
            chunks = self.parser.finish()
        except MalformedOutput:
            chunks = []  # the run is ending anyway; an unparseable tail is dropped
        if ending != "stop":
            # An item cut short is closed by builder.finish with status "incomplete".
            chunks = [chunk for chunk in chunks if not isinstance(chunk, ItemEnded)]
        events = self.builder.feed(chunks)
        events += self.builder.finish(
            ending, input_tokens=self.prompt_tokens, output_tokens=self.generated, error=error
        )
        self.record(write, events)


def replay_run(
    response_id: str,
    fact: RequestFact,
    token_facts: Sequence[TokensFact],
    logged: list[dict[str, Any]],
    chat_format: ChatFormat,
    constraint: LogitsConstraint | None,
    *,
    tool_facts: Sequence[ToolFact] = (),
    next_constraint: Callable[[int], LogitsConstraint | None] | None = None,
    result_tokens: ResultTokens | None = None,
) -> ActiveRun:
    """Rebuild a run from its request fact, its token facts (and the tool facts between them) and its
    logged events; events the replay regenerates beyond the log (e.g. `response.in_progress` of a run
    never started) are left in `pending` to be appended. A logged tool result is fed back exactly as it
    was the first time (service/agent/segment.py), so the continuation is the same."""
    if [e["sequence_number"] for e in logged] != list(range(len(logged))):
        # Left by a version that could commit past a cut-off commit: replaying cannot continue it.
        raise ReplayDiverged(f"the logged events of {response_id} have a hole in their sequence numbers")
    builder = StreamBuilder(fact.response)
    parser = chat_format.new_parser()
    regenerated = builder.created() + builder.in_progress() + builder.compaction(fact.compaction_item)
    regenerated += builder.list_tools(fact.mcp_listed or [])
    approved = fact.approved_call
    if approved is not None:
        regenerated += builder.start_approved_call(
            approved.server_label, approved.name, approved.arguments, approved.approval_request_id
        )
    max_calls = fact.max_tool_calls or 1_000_000
    segment = Segment(list(fact.prompt_token_ids), calls=calls.ToolCalls(response_id, max_calls))
    generated = 0
    pending_tools = list(tool_facts)

    def apply_tool_facts(before: int) -> None:
        nonlocal parser, constraint, regenerated
        while pending_tools and pending_tools[0][0] <= before:
            _, kind, data = pending_tools.pop(0)
            assert segment.calls is not None
            segment.calls.apply(kind, data)
            if kind != calls.RESULT or builder.pending_call is None:
                continue
            item = builder.pending_call
            namespace = item.get("server_label", "python")
            assert result_tokens is not None, "a run with tool results needs result_tokens"
            result = decode_as(ToolCallResult, data)
            tokens = result_tokens(namespace, item.get("name", ""), result.output, result.error)
            regenerated += builder.tool_result(result.output, result.error, result.details)
            segment.next_segment(tokens)
            parser = chat_format.new_parser()
            constraint = next_constraint(segment.calls_made) if next_constraint is not None else None

    for index, tokens_fact in enumerate(token_facts):
        apply_tool_facts(index)
        start = 0
        for size in tokens_fact.group_sizes():  # the steps committed together, folded as they were (record_joined)
            group: list[dict[str, Any]] = []
            for position in range(start, start + size):
                token = tokens_fact.ids[position]
                if constraint is not None:
                    constraint.accept(token)
                logprobs = [tokens_fact.logprobs[position]] if tokens_fact.logprobs is not None else None
                builder.fold_into(group, builder.feed(parser.feed(token), logprobs=logprobs))
                segment.tokens.append(token)
                generated += 1
            regenerated += group
            start += size
    apply_tool_facts(len(token_facts))
    if [e["type"] for e in regenerated[: len(logged)]] != [e["type"] for e in logged]:
        raise ReplayDiverged(f"replaying the tokens of {response_id} did not reproduce its logged events")
    pending = regenerated[len(logged) :]
    # The projection includes what is about to be appended (a queued run's `response.in_progress`),
    # so the row written with it says in_progress.
    return ActiveRun(
        response_id,
        fact,
        builder,
        parser,
        project(logged + pending),
        generated,
        pending=pending,
        token_facts=generated,
        segment=segment,
        constraint=constraint,
    )
