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

from service.prompting.base import ItemDelta, ItemEnded, ItemStarted, OutputChunk, OutputKind
from service.protocol import derived_id

Event = dict[str, Any]
Ending = Literal["stop", "length", "cancelled", "failed"]

_ITEM_PREFIX: dict[OutputKind, str] = {"message": "msg", "reasoning": "rs", "function_call": "fc"}


@dataclass
class _OpenItem:
    kind: OutputKind
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
        return [self._event("response.function_call_arguments.delta", item_id=item_id, output_index=index, delta=text)]

    def _close_open(self, status: str) -> list[Event]:
        open_item, self._open = self._open, None
        if open_item is None:
            return []
        text = "".join(open_item.text)
        item, index, item_id = open_item.item, open_item.output_index, open_item.item["id"]
        out: list[Event] = []
        if open_item.kind == "function_call":
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
        item["status"] = status
        out.append(self._event("response.output_item.done", output_index=index, item=copy.deepcopy(item)))
        return out

    @staticmethod
    def _part(kind: OutputKind, text: str) -> dict[str, Any]:
        if kind == "reasoning":
            return {"type": "reasoning_text", "text": text}
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _snapshot(self) -> dict[str, Any]:
        return copy.deepcopy(self.response)

    def _event(self, event_type: str, **fields: Any) -> Event:
        event = {"type": event_type, "sequence_number": self.next_sequence_number, **fields}
        self.next_sequence_number += 1
        return event
