"""Engine output chunks -> OpenAI Responses stream events.

A synchronous, pure state machine: it owns output indices, content indices and
sequence numbers, so the same request and tokens always give the same events.
That is what lets a resumed run rebuild this state by replay instead of storing it.

The events and items are the typed models of service/protocol/events.py and output.py, made by the
open-item classes of stream_items.py (one per kind) and handed out as their dumps: the JSON the log
stores and clients read.
"""

from __future__ import annotations

import copy
import time
from typing import Any, Literal

from service.agent.items import ITEM_PREFIX as SERVER_PREFIX
from service.agent.items import ServerCall, classify, list_tools_item
from service.prompting.base import ItemDelta, ItemEnded, ItemStarted, OutputChunk
from service.protocol.client_tools import call_namespace, client_call
from service.protocol.events import (
    CodeInterpreterCodeDeltaEvent,
    CustomToolCallInputDeltaEvent,
    FunctionCallArgumentsDeltaEvent,
    ItemStatusType,
    LifecycleType,
    McpCallArgumentsDeltaEvent,
    OutputTextDeltaEvent,
    ReasoningTextDeltaEvent,
    ResponseLifecycleEvent,
    event_types,
)
from service.protocol.output import AnyOutputItem, CodeInterpreterCall, CompactionItem, Logprob, McpCall
from service.protocol.response_object import (
    IncompleteDetails,
    InputTokensDetails,
    OutputTokensDetails,
    ResponseError,
    Usage,
)
from service.reasoning_summary import summary_level
from service.stream_items import (
    Closing,
    Event,
    OpenCustomCall,
    OpenFunctionCall,
    OpenItem,
    OpenMessage,
    OpenReasoning,
    Sink,
    item_id,
)
from service.stream_tool_items import OpenClientCall, OpenServerCall, call_result

Ending = Literal["stop", "length", "cancelled", "failed"]

__all__ = ["Ending", "Event", "StreamBuilder"]


class StreamBuilder:
    def __init__(self, response: dict[str, Any], *, next_sequence_number: int = 0) -> None:
        # `response` is the Response object as created (status queued/in_progress, empty output).
        self.response = copy.deepcopy(response)
        self._out = Sink(next_sequence_number)
        self.output: list[AnyOutputItem] = []
        self.reasoning_tokens = 0
        self._open: OpenItem[Any] | None = None
        self.finished = False
        # Logprobs of tokens not yet attached to a text delta (a token may produce no text by itself).
        self._carried_logprobs: list[Logprob] = []
        self._token_logprobs: list[Logprob] | None = None
        self._tools: list[dict[str, Any]] = self.response.get("tools") or []
        # Calls addressed to these names are custom tool calls (raw `input`, not JSON `arguments`).
        self._custom_tools = {tool.get("name") for tool in self._tools if tool.get("type") == "custom"}
        # A server-side call whose arguments are complete and whose result is awaited (see tool_result).
        self._pending: tuple[McpCall | CodeInterpreterCall, int] | None = None

    @property
    def next_sequence_number(self) -> int:
        return self._out.next_sequence_number

    @next_sequence_number.setter
    def next_sequence_number(self, value: int) -> None:
        self._out.next_sequence_number = value

    @property
    def pending_call(self) -> dict[str, Any] | None:
        """The server-side call awaiting its result, as its item's JSON (None when no call waits)."""
        return self._pending[0].model_dump() if self._pending is not None else None

    # -- lifecycle -------------------------------------------------------------------------
    def created(self) -> list[Event]:
        self._lifecycle("response.created")
        return self._out.take()

    def in_progress(self) -> list[Event]:
        self.response["status"] = "in_progress"
        self._lifecycle("response.in_progress")
        return self._out.take()

    def feed(
        self, chunks: list[OutputChunk], *, token_count: int = 1, logprobs: list[dict[str, Any]] | None = None
    ) -> list[Event]:
        """`logprobs`: entries for the token(s) behind these chunks, when the request asked for them."""
        if isinstance(self._open, OpenReasoning):
            self.reasoning_tokens += token_count
        self._token_logprobs = [Logprob.model_validate(entry) for entry in logprobs] if logprobs else None
        for chunk in chunks:
            if isinstance(chunk, ItemStarted):
                self._close_open("completed")
                self._start(chunk)
            elif isinstance(chunk, ItemDelta):
                if self._open is None:  # defensive: a parser that forgot ItemStarted gets a message item
                    self._start(ItemStarted("message"))
                self._delta(chunk.text)
            elif isinstance(chunk, ItemEnded):
                self._close_open("completed")
        # A token that opened the item (a header token) is not text; one inside a message that
        # yielded no text yet (part of a UTF-8 sequence) rides on the next delta.
        opened = any(isinstance(chunk, ItemStarted) for chunk in chunks)
        if self._token_logprobs and not opened and isinstance(self._open, OpenMessage):
            self._carried_logprobs += self._token_logprobs
        self._token_logprobs = None
        return self._out.take()

    def finish(
        self,
        ending: Ending,
        *,
        input_tokens: int,
        output_tokens: int,
        error: dict[str, str] | None = None,
        completed_at: int | None = None,
    ) -> list[Event]:
        """Close any open item and emit the one terminal event."""
        assert not self.finished, "a response has exactly one terminal event"
        self.finished = True
        self._close_open("completed" if ending == "stop" else "incomplete")
        if self._pending is not None:  # the run ended while a server-side call was in flight
            (item, index), self._pending = self._pending, None
            item.status = "incomplete"
            self._out.item("done", index, item)
        response = self.response
        response["output"] = [item.model_dump() for item in self.output]
        response["usage"] = Usage(
            input_tokens=input_tokens,
            input_tokens_details=InputTokensDetails(cached_tokens=0, cache_write_tokens=0),
            output_tokens=output_tokens,
            output_tokens_details=OutputTokensDetails(reasoning_tokens=self.reasoning_tokens),
            total_tokens=input_tokens + output_tokens,
        ).model_dump()
        response["completed_at"] = completed_at if completed_at is not None else int(time.time())
        if ending == "stop":
            response["status"] = "completed"
            self._lifecycle("response.completed")
        elif ending == "length":
            response["status"] = "incomplete"
            response["incomplete_details"] = IncompleteDetails(reason="max_output_tokens").model_dump()
            self._lifecycle("response.incomplete")
        elif ending == "cancelled":
            # OpenAI defines no event for a cancelled stream: we end it with `response.incomplete`
            # carrying status "cancelled", which every client already knows how to read.
            response["status"] = "cancelled"
            self._lifecycle("response.incomplete")
        else:
            response["status"] = "failed"
            failure = ResponseError.model_validate(error or {"code": "server_error", "message": "The run failed."})
            response["error"] = failure.model_dump()
            self._lifecycle("response.failed")
        return self._out.take()

    def _lifecycle(self, event_type: LifecycleType) -> None:
        # The snapshot is sent key for key as the log holds it (ResponseSnapshot); the dump copies it.
        number = self._out.number()
        self._out.send(ResponseLifecycleEvent(type=event_type, sequence_number=number, response=self.response))

    # -- items -----------------------------------------------------------------------------
    def _start(self, chunk: ItemStarted) -> None:
        index, response_id, out = len(self.output), self.response["id"], self._out
        opened: OpenItem[Any]
        if chunk.kind == "message":
            opened = OpenMessage.start(response_id, index, out)
        elif chunk.kind == "reasoning":
            opened = OpenReasoning.start(response_id, index, summary_level(self.response.get("reasoning")), out)
        elif chunk.name in self._custom_tools:
            opened = OpenCustomCall.start(response_id, index, chunk.name or "", out)
        elif client := client_call(chunk.name, self._tools):
            opened = OpenClientCall.start(client, response_id, index, out)
        elif server := classify(chunk.name, self._tools):
            opened = OpenServerCall.start(server, response_id, index, self._tools, out)
        else:
            namespace = call_namespace(chunk.name, self._tools)
            opened = OpenFunctionCall.start(response_id, index, chunk.name or "", namespace, out)
        self.output.append(opened.item)
        self._open = opened
        self._carried_logprobs = []

    def start_approved_call(self, namespace: str, name: str, arguments: str, approval_request_id: str) -> list[Event]:
        """An `mcp_call` the client approved in its request: complete from the start, awaiting its result."""
        call = ServerCall("mcp_call", namespace, name)
        opened = OpenServerCall.start(call, self.response["id"], len(self.output), self._tools, self._out)
        assert isinstance(opened.item, McpCall)
        opened.item.approval_request_id = approval_request_id
        opened.text.append(arguments)
        self.output.append(opened.item)
        self._open = opened
        self._close_open("completed")
        return self._out.take()

    def compaction(self, item: dict[str, Any] | None) -> list[Event]:
        """The `compaction` item of a response compacted by `context_management` (made before sampling)."""
        if item is None:
            return []
        index, compacted = len(self.output), CompactionItem.model_validate(item)
        self.output.append(compacted)
        self._out.item("added", index, compacted)
        self._out.status("response.compaction.compacting", compacted.id, index)
        self._out.item("done", index, compacted)
        return self._out.take()

    def list_tools(self, listed: list[dict[str, Any]]) -> list[Event]:
        """`mcp_list_tools` items for the servers listed when the request was created."""
        for entry in listed:
            index = len(self.output)
            item = list_tools_item(item_id(SERVER_PREFIX["mcp_list_tools"], self.response["id"], index), entry)
            self.output.append(item)
            self._out.item("added", index, item.model_copy(update={"tools": []}))
            self._out.status("response.mcp_list_tools.in_progress", item.id, index)
            ending: ItemStatusType = (
                "response.mcp_list_tools.failed" if item.error else "response.mcp_list_tools.completed"
            )
            self._out.status(ending, item.id, index)
            self._out.item("done", index, item)
        return self._out.take()

    def tool_result(self, output: str | None, error: str | None, details: dict[str, Any] | None = None) -> list[Event]:
        """The pending server-side call returned: its item is done."""
        assert self._pending is not None, "no server-side call is waiting for a result"
        (item, index), self._pending = self._pending, None
        call_result(item, index, output, error, self._out)
        return self._out.take()

    def _delta(self, text: str) -> None:
        assert self._open is not None
        if not text:
            return
        logprobs: list[Logprob] = []
        if isinstance(self._open, OpenMessage):
            logprobs = self._carried_logprobs + (self._token_logprobs or [])
            self._carried_logprobs, self._token_logprobs = [], None
        self._open.delta(text, logprobs, self._out)

    def _close_open(self, status: Closing) -> None:
        open_item, self._open = self._open, None
        if open_item is None:
            return
        open_item.close(status, self._out)
        if isinstance(open_item, OpenServerCall) and open_item.calling is not None:
            self._pending = (open_item.calling, open_item.index)

    def fold_into(self, events: list[Event], later: list[Event], *, group_start: int = 0) -> None:
        """Append `later`, the events this builder emitted last, to `events`, which ends with those it emitted
        just before: a leading delta of `later` is folded into the trailing delta of the same content, if that
        one is at or after `group_start`. Several engine steps committed together thus give one delta event per
        content instead of one per token; the folded event's successors and this builder's counter move back
        by one, so sequence numbers stay contiguous. Pure given the grouping, which replay repeats."""
        if (
            later
            and len(events) > group_start
            and _foldable(events[-1], later[0])
            and events[-1]["sequence_number"] + 1 == later[0]["sequence_number"]
            and later[-1]["sequence_number"] + 1 == self.next_sequence_number
        ):
            events[-1] = _folded(events[-1], later[0])
            for event in later[1:]:
                event["sequence_number"] -= 1
            self.next_sequence_number -= 1
            later = later[1:]
        events.extend(later)


# Delta events whose text (and logprobs) concatenate: folding two of the same content gives the one event
# a single delta of both texts would have been.
_FOLDABLE_DELTAS = event_types(
    OutputTextDeltaEvent,
    ReasoningTextDeltaEvent,
    FunctionCallArgumentsDeltaEvent,
    CustomToolCallInputDeltaEvent,
    McpCallArgumentsDeltaEvent,
    CodeInterpreterCodeDeltaEvent,
)


def _foldable(earlier: Event, later: Event) -> bool:
    return (
        earlier["type"] == later["type"]
        and earlier["type"] in _FOLDABLE_DELTAS
        and earlier.get("item_id") == later.get("item_id")
        and earlier.get("output_index") == later.get("output_index")
        and earlier.get("content_index") == later.get("content_index")
    )


def _folded(earlier: Event, later: Event) -> Event:
    """One delta for both (a new dict: a projection or a write may still hold `earlier`)."""
    folded = {**earlier, "delta": earlier["delta"] + later["delta"]}
    if "logprobs" in earlier or "logprobs" in later:
        folded["logprobs"] = [*earlier.get("logprobs", []), *later.get("logprobs", [])]
    return folded
