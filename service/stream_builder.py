"""Engine output chunks -> OpenAI Responses stream events.

A synchronous, pure state machine: it owns output indices, content indices and
sequence numbers, so the same request and tokens always give the same events.
That is what lets a resumed run rebuild this state by replay instead of storing it.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from service.agent.items import ITEM_PREFIX as SERVER_PREFIX
from service.agent.items import ServerCall, ServerKind, classify, list_tools_item, mcp_error, new_item
from service.prompting.base import ItemDelta, ItemEnded, ItemStarted, OutputChunk, OutputKind
from service.protocol import derived_id
from service.protocol.client_tools import CALL_TYPES, ITEM_PREFIX, ClientKind, call_fields, call_namespace, client_call
from service.reasoning_summary import summarize, summary_level

Event = dict[str, Any]
Ending = Literal["stop", "length", "cancelled", "failed"]

_ITEM_PREFIX: dict[OutputKind, str] = {"message": "msg", "reasoning": "rs", "function_call": "fc"}
# A call to a custom tool (the parser reports it as a function_call; the tools list tells them apart).
_CUSTOM_CALL: Literal["custom_tool_call"] = "custom_tool_call"
# A call to a client tool with its own item type (shell_call, ...): built whole when its arguments end.
_CLIENT_CALL: Literal["client_call"] = "client_call"
# The item each client call starts as (the SDK requires its action/operation before the arguments are known).
_EMPTY_FIELDS: dict[ClientKind, dict[str, Any]] = {
    "shell": {"action": {"commands": []}},
    "local_shell": {"action": {"type": "exec", "command": [], "env": {}}},
    "apply_patch": {"operation": {"type": "update_file", "path": "", "diff": ""}},
}


@dataclass
class _OpenItem:
    kind: OutputKind | Literal["custom_tool_call", "client_call"] | ServerKind
    item: dict[str, Any]
    output_index: int
    text: list[str] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)


class StreamBuilder:
    def __init__(self, response: dict[str, Any], *, next_sequence_number: int = 0) -> None:
        # `response` is the Response object as created (status queued/in_progress, empty output).
        self.response = copy.deepcopy(response)
        self.next_sequence_number = next_sequence_number
        self.output: list[dict[str, Any]] = []
        self.reasoning_tokens = 0
        self._open: _OpenItem | None = None
        self.finished = False
        # Logprobs of tokens not yet attached to a text delta (a token may produce no text by itself).
        self._carried_logprobs: list[dict[str, Any]] = []
        self._token_logprobs: list[dict[str, Any]] | None = None
        # Calls addressed to these names are custom tool calls (raw `input`, not JSON `arguments`).
        self._custom_tools = {
            tool.get("name") for tool in self.response.get("tools") or [] if tool.get("type") == "custom"
        }
        # A server-side call whose arguments are complete and whose result is awaited (see tool_result).
        self.pending_call: dict[str, Any] | None = None
        self._pending_index = 0

    # -- lifecycle -------------------------------------------------------------------------
    def created(self) -> list[Event]:
        return [self._event("response.created", response=self._snapshot())]

    def in_progress(self) -> list[Event]:
        self.response["status"] = "in_progress"
        return [self._event("response.in_progress", response=self._snapshot())]

    def feed(
        self, chunks: list[OutputChunk], *, token_count: int = 1, logprobs: list[dict[str, Any]] | None = None
    ) -> list[Event]:
        """`logprobs`: entries for the token(s) behind these chunks, when the request asked for them."""
        if self._open is not None and self._open.kind == "reasoning":
            self.reasoning_tokens += token_count
        self._token_logprobs = logprobs
        out = self._feed(chunks)
        # A token that opened the item (a header token) is not text; one inside a message that
        # yielded no text yet (part of a UTF-8 sequence) rides on the next delta.
        opened = any(isinstance(chunk, ItemStarted) for chunk in chunks)
        if self._token_logprobs and not opened and self._open is not None and self._open.kind == "message":
            self._carried_logprobs += self._token_logprobs
        self._token_logprobs = None
        return out

    def _feed(self, chunks: list[OutputChunk]) -> list[Event]:
        out: list[Event] = []
        for chunk in chunks:
            if isinstance(chunk, ItemStarted):
                out += self._close_open("completed")
                out += self._start(chunk)
            elif isinstance(chunk, ItemDelta):
                if self._open is None:  # defensive: a parser that forgot ItemStarted gets a message item
                    out += self._start(ItemStarted("message"))
                out += self._delta(chunk.text)
            elif isinstance(chunk, ItemEnded):
                out += self._close_open("completed")
        return out

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
        out = self._close_open("completed" if ending == "stop" else "incomplete")
        if self.pending_call is not None:  # the run ended while a server-side call was in flight
            item, self.pending_call = self.pending_call, None
            item["status"] = "incomplete"
            out.append(
                self._event("response.output_item.done", output_index=self._pending_index, item=copy.deepcopy(item))
            )
        self.response["output"] = copy.deepcopy(self.output)
        self.response["usage"] = {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": input_tokens + output_tokens,
        }
        self.response["completed_at"] = completed_at if completed_at is not None else int(time.time())
        if ending == "stop":
            self.response["status"] = "completed"
            out.append(self._event("response.completed", response=self._snapshot()))
        elif ending == "length":
            self.response["status"] = "incomplete"
            self.response["incomplete_details"] = {"reason": "max_output_tokens"}
            out.append(self._event("response.incomplete", response=self._snapshot()))
        elif ending == "cancelled":
            # OpenAI defines no event for a cancelled stream: we end it with `response.incomplete`
            # carrying status "cancelled", which every client already knows how to read.
            self.response["status"] = "cancelled"
            out.append(self._event("response.incomplete", response=self._snapshot()))
        else:
            self.response["status"] = "failed"
            self.response["error"] = error or {"code": "server_error", "message": "The run failed."}
            out.append(self._event("response.failed", response=self._snapshot()))
        return out

    # -- items -----------------------------------------------------------------------------
    def _start(self, chunk: ItemStarted) -> list[Event]:
        output_index = len(self.output)
        if chunk.kind == "function_call" and chunk.name in self._custom_tools:
            return self._start_custom_call(chunk.name or "", output_index)
        if chunk.kind == "function_call" and (client := client_call(chunk.name, self.response.get("tools") or [])):
            return self._start_client_call(client, output_index)
        server = classify(chunk.name, self.response.get("tools") or []) if chunk.kind == "function_call" else None
        if server is not None:
            return self._start_server_call(server.kind, server.namespace, server.name, output_index)
        item_id = derived_id(_ITEM_PREFIX[chunk.kind], self.response["id"], f"output:{output_index}")
        item: dict[str, Any]
        if chunk.kind == "message":
            item = {"id": item_id, "type": "message", "status": "in_progress", "role": "assistant", "content": []}
        elif chunk.kind == "reasoning":
            item = {"id": item_id, "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}
        else:
            call_id = derived_id("call", self.response["id"], f"output:{output_index}")
            item = {
                "id": item_id,
                "type": "function_call",
                "status": "in_progress",
                "call_id": call_id,
                "name": chunk.name or "",
                "arguments": "",
            }
            if (namespace := call_namespace(chunk.name, self.response.get("tools") or [])) is not None:
                item["namespace"] = namespace  # a namespace's function: its bare name, and its namespace
        self.output.append(item)
        self._open = _OpenItem(chunk.kind, item, output_index)
        self._carried_logprobs = []
        out = [self._event("response.output_item.added", output_index=output_index, item=copy.deepcopy(item))]
        if chunk.kind != "function_call":
            out.append(
                self._event(
                    "response.content_part.added",
                    item_id=item_id,
                    output_index=output_index,
                    content_index=0,
                    part=self._part(chunk.kind, ""),
                )
            )
        return out

    def _start_custom_call(self, name: str, output_index: int) -> list[Event]:
        item = {
            "id": derived_id("ctc", self.response["id"], f"output:{output_index}"),
            "type": "custom_tool_call",
            "status": "in_progress",
            "call_id": derived_id("call", self.response["id"], f"output:{output_index}"),
            "name": name,
            "input": "",
        }
        self.output.append(item)
        self._open = _OpenItem(_CUSTOM_CALL, item, output_index)
        self._carried_logprobs = []
        return [self._event("response.output_item.added", output_index=output_index, item=copy.deepcopy(item))]

    def _start_client_call(self, kind: ClientKind, output_index: int) -> list[Event]:
        """A shell/local_shell/apply_patch call: added now, its action filled in when the arguments end (the SDK
        has no argument delta events for these items)."""
        item = {
            "id": derived_id(ITEM_PREFIX[CALL_TYPES[kind]], self.response["id"], f"output:{output_index}"),
            "type": CALL_TYPES[kind],
            "status": "in_progress",
            "call_id": derived_id("call", self.response["id"], f"output:{output_index}"),
            **copy.deepcopy(_EMPTY_FIELDS[kind]),
        }
        self.output.append(item)
        self._open = _OpenItem(_CLIENT_CALL, item, output_index)
        self._carried_logprobs = []
        return [self._event("response.output_item.added", output_index=output_index, item=copy.deepcopy(item))]

    def _start_server_call(self, kind: ServerKind, namespace: str, name: str, output_index: int) -> list[Event]:
        item_id = derived_id(SERVER_PREFIX[kind], self.response["id"], f"output:{output_index}")
        item = new_item(
            ServerCall(kind, namespace, name), item_id, self.response["id"], self.response.get("tools") or []
        )
        self.output.append(item)
        self._open = _OpenItem(kind, item, output_index)
        self._carried_logprobs = []
        out = [self._event("response.output_item.added", output_index=output_index, item=copy.deepcopy(item))]
        if kind != "mcp_approval_request":
            out.append(self._event(f"response.{kind}.in_progress", item_id=item_id, output_index=output_index))
        return out

    def start_approved_call(self, namespace: str, name: str, arguments: str, approval_request_id: str) -> list[Event]:
        """An `mcp_call` the client approved in its request: complete from the start, awaiting its result."""
        out = self._start_server_call("mcp_call", namespace, name, len(self.output))
        assert self._open is not None
        self._open.item["approval_request_id"] = approval_request_id
        self._open.text.append(arguments)
        return out + self._close_open("completed")

    def compaction(self, item: dict[str, Any] | None) -> list[Event]:
        """The `compaction` item of a response compacted by `context_management` (made before sampling)."""
        if item is None:
            return []
        index = len(self.output)
        self.output.append(copy.deepcopy(item))
        return [
            self._event("response.output_item.added", output_index=index, item=copy.deepcopy(item)),
            self._event("response.compaction.compacting", item_id=item["id"], output_index=index),
            self._event("response.output_item.done", output_index=index, item=copy.deepcopy(item)),
        ]

    def list_tools(self, listed: list[dict[str, Any]]) -> list[Event]:
        """`mcp_list_tools` items for the servers listed when the request was created."""
        out: list[Event] = []
        for entry in listed:
            index = len(self.output)
            item_id = derived_id(SERVER_PREFIX["mcp_list_tools"], self.response["id"], f"output:{index}")
            item = list_tools_item(item_id, entry)
            self.output.append(item)
            out.append(self._event("response.output_item.added", output_index=index, item={**item, "tools": []}))
            out.append(self._event("response.mcp_list_tools.in_progress", item_id=item_id, output_index=index))
            ending = "failed" if item["error"] else "completed"
            out.append(self._event(f"response.mcp_list_tools.{ending}", item_id=item_id, output_index=index))
            out.append(self._event("response.output_item.done", output_index=index, item=copy.deepcopy(item)))
        return out

    def tool_result(self, output: str | None, error: str | None, details: dict[str, Any] | None = None) -> list[Event]:
        """The pending server-side call returned: its item is done."""
        item, self.pending_call = self.pending_call, None
        assert item is not None, "no server-side call is waiting for a result"
        index, item_id = self._pending_index, item["id"]
        if item["type"] == "code_interpreter_call":
            logs = output if output is not None else (error or "")
            item["outputs"] = [{"type": "logs", "logs": logs}]
            item["status"] = "completed" if error is None else "failed"
            ending = "completed"
        else:
            item["output"] = output
            item["error"] = mcp_error(error) if error is not None else None
            item["status"] = ending = "completed" if error is None else "failed"
        self.output[index] = item
        return [
            self._event(f"response.{item['type']}.{ending}", item_id=item_id, output_index=index),
            self._event("response.output_item.done", output_index=index, item=copy.deepcopy(item)),
        ]

    def _delta(self, text: str) -> list[Event]:
        assert self._open is not None
        if not text:
            return []
        self._open.text.append(text)
        item_id, index = self._open.item["id"], self._open.output_index
        if self._open.kind == "message":
            logprobs = self._carried_logprobs + (self._token_logprobs or [])
            self._carried_logprobs, self._token_logprobs = [], None
            self._open.logprobs += logprobs
            return [
                self._event(
                    "response.output_text.delta",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    delta=text,
                    logprobs=copy.deepcopy(logprobs),
                )
            ]
        if self._open.kind == "reasoning":
            return [
                self._event(
                    "response.reasoning_text.delta", item_id=item_id, output_index=index, content_index=0, delta=text
                )
            ]
        if self._open.kind == _CUSTOM_CALL:
            kind = "response.custom_tool_call_input.delta"
            return [self._event(kind, item_id=item_id, output_index=index, delta=text)]
        if self._open.kind == "code_interpreter_call":
            kind = "response.code_interpreter_call_code.delta"
            return [self._event(kind, item_id=item_id, output_index=index, delta=text)]
        if self._open.kind == "mcp_call":
            return [self._event("response.mcp_call_arguments.delta", item_id=item_id, output_index=index, delta=text)]
        if self._open.kind in ("mcp_approval_request", _CLIENT_CALL):
            return []  # no argument events for these items: the done item carries them
        return [self._event("response.function_call_arguments.delta", item_id=item_id, output_index=index, delta=text)]

    def _close_open(self, status: str) -> list[Event]:
        open_item, self._open = self._open, None
        if open_item is None:
            return []
        text = "".join(open_item.text)
        item, index, item_id = open_item.item, open_item.output_index, open_item.item["id"]
        out: list[Event] = []
        if open_item.kind in ("mcp_call", "code_interpreter_call", "mcp_approval_request"):
            return out + self._close_server_call(open_item, text, status)
        if open_item.kind == _CLIENT_CALL:
            kind: ClientKind = item["type"].removesuffix("_call")
            item.update(call_fields(kind, text))
            if kind == "apply_patch":  # the SDK's apply_patch_call has no `incomplete`
                status = "completed" if status == "completed" else "in_progress"
        elif open_item.kind == _CUSTOM_CALL:
            item["input"] = text
            out.append(
                self._event("response.custom_tool_call_input.done", item_id=item_id, output_index=index, input=text)
            )
        elif open_item.kind == "function_call":
            item["arguments"] = text
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item_id,
                    output_index=index,
                    name=item["name"],
                    arguments=text,
                )
            )
        else:
            part = self._part(open_item.kind, text)
            done_type = "response.output_text.done" if open_item.kind == "message" else "response.reasoning_text.done"
            extra: dict[str, Any] = {}
            if open_item.kind == "message":
                part["logprobs"] = open_item.logprobs
                extra = {"logprobs": copy.deepcopy(open_item.logprobs)}
            out.append(self._event(done_type, item_id=item_id, output_index=index, content_index=0, text=text, **extra))
            out.append(
                self._event(
                    "response.content_part.done",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    part=copy.deepcopy(part),
                )
            )
            item["content"] = [part]
            if open_item.kind == "reasoning":
                out += self._summary(item, index, text)
        item["status"] = status
        out.append(self._event("response.output_item.done", output_index=index, item=copy.deepcopy(item)))
        return out

    def _summary(self, item: dict[str, Any], index: int, text: str) -> list[Event]:
        """A closing reasoning item's summary part, when the request asked for one (`reasoning.summary`)."""
        level = summary_level(self.response.get("reasoning"))
        summary = summarize(text, level) if level else ""
        if not summary:
            return []
        item_id, empty = item["id"], {"type": "summary_text", "text": ""}
        at = {"item_id": item_id, "output_index": index, "summary_index": 0}
        part = {"type": "summary_text", "text": summary}
        item["summary"] = [copy.deepcopy(part)]
        return [
            self._event("response.reasoning_summary_part.added", **at, part=empty),
            self._event("response.reasoning_summary_text.delta", **at, delta=summary),
            self._event("response.reasoning_summary_text.done", **at, text=summary),
            self._event("response.reasoning_summary_part.done", **at, part=part),
        ]

    def _close_server_call(self, open_item: _OpenItem, text: str, status: str) -> list[Event]:
        """Arguments (code) complete: a call that is whole waits for its result (`pending_call`)."""
        item, index, item_id = open_item.item, open_item.output_index, open_item.item["id"]
        out: list[Event] = []
        if open_item.kind == "code_interpreter_call":
            item["code"] = text
            out.append(
                self._event("response.code_interpreter_call_code.done", item_id=item_id, output_index=index, code=text)
            )
        else:
            item["arguments"] = text
            if open_item.kind == "mcp_call":
                out.append(
                    self._event("response.mcp_call_arguments.done", item_id=item_id, output_index=index, arguments=text)
                )
        if open_item.kind == "mcp_approval_request":
            return out + [self._event("response.output_item.done", output_index=index, item=copy.deepcopy(item))]
        if status != "completed":
            item["status"] = "incomplete"
            return out + [self._event("response.output_item.done", output_index=index, item=copy.deepcopy(item))]
        if open_item.kind == "code_interpreter_call":
            item["status"] = "interpreting"
            out.append(self._event("response.code_interpreter_call.interpreting", item_id=item_id, output_index=index))
        else:
            item["status"] = "calling"
        self.pending_call, self._pending_index = item, index
        return out

    @staticmethod
    def _part(kind: str, text: str) -> dict[str, Any]:
        if kind == "reasoning":
            return {"type": "reasoning_text", "text": text}
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _snapshot(self) -> dict[str, Any]:
        return copy.deepcopy(self.response)

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

    def _event(self, event_type: str, **fields: Any) -> Event:
        event = {"type": event_type, "sequence_number": self.next_sequence_number, **fields}
        self.next_sequence_number += 1
        return event


# Delta events whose text (and logprobs) concatenate: folding two of the same content gives the one event
# a single delta of both texts would have been.
_FOLDABLE_DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.reasoning_text.delta",
        "response.function_call_arguments.delta",
        "response.custom_tool_call_input.delta",
        "response.mcp_call_arguments.delta",
        "response.code_interpreter_call_code.delta",
    }
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
