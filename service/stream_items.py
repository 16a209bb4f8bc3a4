"""The output items of a response's stream while they are open, one class per kind.

Each makes its item (a typed model of service/protocol/output.py) and the events of its start, its text
and its close (service/protocol/events.py); the StreamBuilder (stream_builder.py) decides which kind a chunk
opens and when items close. Events go through a `Sink`, which numbers them as they are made and dumps each
at once: the item goes on changing after an event has shown it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Generic, Literal, TypeVar

from service.protocol import derived_id
from service.protocol.events import (
    AnyStreamEvent,
    ContentPartEvent,
    CustomToolCallInputDeltaEvent,
    CustomToolCallInputDoneEvent,
    FunctionCallArgumentsDeltaEvent,
    FunctionCallArgumentsDoneEvent,
    ItemStatusEvent,
    ItemStatusType,
    OutputItemEvent,
    OutputTextDeltaEvent,
    OutputTextDoneEvent,
    ReasoningSummaryPartEvent,
    ReasoningSummaryTextDeltaEvent,
    ReasoningSummaryTextDoneEvent,
    ReasoningTextDeltaEvent,
    ReasoningTextDoneEvent,
)
from service.protocol.output import (
    AnyOutputItem,
    CustomToolCall,
    FunctionCall,
    Logprob,
    OutputMessage,
    OutputText,
    ReasoningOutputItem,
    ReasoningTextContent,
    SummaryText,
)
from service.reasoning_summary import summarize

Event = dict[str, Any]
Item = TypeVar("Item", bound=AnyOutputItem)
# How an item ends: whole, or cut short by the end of its run.
Closing = Literal["completed", "incomplete"]


class Sink:
    """Numbers a builder's events as they are made and keeps their dumps until the builder hands them out."""

    def __init__(self, next_sequence_number: int) -> None:
        self.next_sequence_number = next_sequence_number
        self._events: list[Event] = []

    def number(self) -> int:
        number = self.next_sequence_number
        self.next_sequence_number += 1
        return number

    def send(self, event: AnyStreamEvent) -> None:
        self._events.append(event.model_dump())

    def take(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def item(self, kind: Literal["added", "done"], index: int, item: AnyOutputItem) -> None:
        event_type: Literal["response.output_item.added", "response.output_item.done"] = (
            "response.output_item.added" if kind == "added" else "response.output_item.done"
        )
        self.send(OutputItemEvent(type=event_type, sequence_number=self.number(), output_index=index, item=item))

    def status(self, event_type: ItemStatusType, item_id: str, index: int) -> None:
        self.send(ItemStatusEvent(type=event_type, sequence_number=self.number(), item_id=item_id, output_index=index))


def item_id(prefix: str, response_id: str, index: int) -> str:
    """An output item's id: derived from the response and the item's place, so replay derives the same."""
    return derived_id(prefix, response_id, f"output:{index}")


def call_id(response_id: str, index: int) -> str:
    return item_id("call", response_id, index)


class OpenItem(ABC, Generic[Item]):
    """An output item between its `output_item.added` and its `output_item.done`; `text` what the model wrote
    in it so far (message or reasoning text, arguments, custom input, code)."""

    def __init__(self, item: Item, index: int) -> None:
        self.item = item
        self.index = index
        self.text: list[str] = []

    def delta(self, text: str, logprobs: list[Logprob], out: Sink) -> None:
        """More text (not empty); `logprobs`: its tokens' (a message's only)."""
        self.text.append(text)

    @abstractmethod
    def close(self, status: Closing, out: Sink) -> None:
        """The item ends: `completed`, or `incomplete` when the run ended inside it."""


class OpenMessage(OpenItem[OutputMessage]):
    def __init__(self, item: OutputMessage, index: int) -> None:
        super().__init__(item, index)
        self.logprobs: list[Logprob] = []

    @classmethod
    def start(cls, response_id: str, index: int, out: Sink) -> OpenMessage:
        item_ = OutputMessage(
            id=item_id("msg", response_id, index), type="message", status="in_progress", role="assistant", content=[]
        )
        out.item("added", index, item_)
        out.send(_part_event("response.content_part.added", out, item_.id, index, _text_part("", [])))
        return cls(item_, index)

    def delta(self, text: str, logprobs: list[Logprob], out: Sink) -> None:
        self.text.append(text)
        self.logprobs += logprobs
        out.send(
            OutputTextDeltaEvent(
                type="response.output_text.delta",
                sequence_number=out.number(),
                item_id=self.item.id,
                output_index=self.index,
                content_index=0,
                delta=text,
                logprobs=logprobs,
            )
        )

    def close(self, status: Closing, out: Sink) -> None:
        text, item_ = "".join(self.text), self.item
        out.send(
            OutputTextDoneEvent(
                type="response.output_text.done",
                sequence_number=out.number(),
                item_id=item_.id,
                output_index=self.index,
                content_index=0,
                text=text,
                logprobs=self.logprobs,
            )
        )
        part = _text_part(text, self.logprobs)
        out.send(_part_event("response.content_part.done", out, item_.id, self.index, part))
        item_.content = [part]
        item_.status = status
        out.item("done", self.index, item_)


class OpenReasoning(OpenItem[ReasoningOutputItem]):
    def __init__(self, item: ReasoningOutputItem, index: int, summary_level: str | None) -> None:
        super().__init__(item, index)
        self.summary_level = summary_level

    @classmethod
    def start(cls, response_id: str, index: int, summary_level: str | None, out: Sink) -> OpenReasoning:
        item_ = ReasoningOutputItem(
            id=item_id("rs", response_id, index), type="reasoning", summary=[], content=[], status="in_progress"
        )
        out.item("added", index, item_)
        part = ReasoningTextContent(type="reasoning_text", text="")
        out.send(_part_event("response.content_part.added", out, item_.id, index, part))
        return cls(item_, index, summary_level)

    def delta(self, text: str, logprobs: list[Logprob], out: Sink) -> None:
        self.text.append(text)
        out.send(
            ReasoningTextDeltaEvent(
                type="response.reasoning_text.delta",
                sequence_number=out.number(),
                item_id=self.item.id,
                output_index=self.index,
                content_index=0,
                delta=text,
            )
        )

    def close(self, status: Closing, out: Sink) -> None:
        text, item_, index = "".join(self.text), self.item, self.index
        out.send(
            ReasoningTextDoneEvent(
                type="response.reasoning_text.done",
                sequence_number=out.number(),
                item_id=item_.id,
                output_index=index,
                content_index=0,
                text=text,
            )
        )
        part = ReasoningTextContent(type="reasoning_text", text=text)
        out.send(_part_event("response.content_part.done", out, item_.id, index, part))
        item_.content = [part]
        self._summary(text, out)
        item_.status = status
        out.item("done", index, item_)

    def _summary(self, text: str, out: Sink) -> None:
        """The item's summary part, when the request asked for one (`reasoning.summary`)."""
        summary = summarize(text, self.summary_level) if self.summary_level else ""
        if not summary:
            return
        self.item.summary = [SummaryText(type="summary_text", text=summary)]
        item_id_, index = self.item.id, self.index
        empty = SummaryText(type="summary_text", text="")
        for event in (
            ReasoningSummaryPartEvent(
                type="response.reasoning_summary_part.added",
                sequence_number=out.number(),
                item_id=item_id_,
                output_index=index,
                summary_index=0,
                part=empty,
            ),
            ReasoningSummaryTextDeltaEvent(
                type="response.reasoning_summary_text.delta",
                sequence_number=out.number(),
                item_id=item_id_,
                output_index=index,
                summary_index=0,
                delta=summary,
            ),
            ReasoningSummaryTextDoneEvent(
                type="response.reasoning_summary_text.done",
                sequence_number=out.number(),
                item_id=item_id_,
                output_index=index,
                summary_index=0,
                text=summary,
            ),
            ReasoningSummaryPartEvent(
                type="response.reasoning_summary_part.done",
                sequence_number=out.number(),
                item_id=item_id_,
                output_index=index,
                summary_index=0,
                part=SummaryText(type="summary_text", text=summary),
            ),
        ):
            out.send(event)


class OpenFunctionCall(OpenItem[FunctionCall]):
    @classmethod
    def start(cls, response_id: str, index: int, name: str, namespace: str | None, out: Sink) -> OpenFunctionCall:
        item_ = FunctionCall(
            id=item_id("fc", response_id, index),
            type="function_call",
            status="in_progress",
            call_id=call_id(response_id, index),
            name=name,
            arguments="",
            namespace=namespace,
        )
        out.item("added", index, item_)
        return cls(item_, index)

    def delta(self, text: str, logprobs: list[Logprob], out: Sink) -> None:
        self.text.append(text)
        out.send(
            FunctionCallArgumentsDeltaEvent(
                type="response.function_call_arguments.delta",
                sequence_number=out.number(),
                item_id=self.item.id,
                output_index=self.index,
                delta=text,
            )
        )

    def close(self, status: Closing, out: Sink) -> None:
        item_ = self.item
        item_.arguments = "".join(self.text)
        out.send(
            FunctionCallArgumentsDoneEvent(
                type="response.function_call_arguments.done",
                sequence_number=out.number(),
                item_id=item_.id,
                output_index=self.index,
                name=item_.name,
                arguments=item_.arguments,
            )
        )
        item_.status = status
        out.item("done", self.index, item_)


class OpenCustomCall(OpenItem[CustomToolCall]):
    """A call to a custom tool (the parser reports it as a function call; the tools list tells them apart)."""

    @classmethod
    def start(cls, response_id: str, index: int, name: str, out: Sink) -> OpenCustomCall:
        item_ = CustomToolCall(
            id=item_id("ctc", response_id, index),
            type="custom_tool_call",
            status="in_progress",
            call_id=call_id(response_id, index),
            name=name,
            input="",
        )
        out.item("added", index, item_)
        return cls(item_, index)

    def delta(self, text: str, logprobs: list[Logprob], out: Sink) -> None:
        self.text.append(text)
        out.send(
            CustomToolCallInputDeltaEvent(
                type="response.custom_tool_call_input.delta",
                sequence_number=out.number(),
                item_id=self.item.id,
                output_index=self.index,
                delta=text,
            )
        )

    def close(self, status: Closing, out: Sink) -> None:
        item_ = self.item
        item_.input = "".join(self.text)
        out.send(
            CustomToolCallInputDoneEvent(
                type="response.custom_tool_call_input.done",
                sequence_number=out.number(),
                item_id=item_.id,
                output_index=self.index,
                input=item_.input,
            )
        )
        item_.status = status
        out.item("done", self.index, item_)


def _text_part(text: str, logprobs: list[Logprob]) -> OutputText:
    return OutputText(type="output_text", text=text, annotations=[], logprobs=logprobs)


def _part_event(
    event_type: Literal["response.content_part.added", "response.content_part.done"],
    out: Sink,
    item_id_: str,
    index: int,
    part: OutputText | ReasoningTextContent,
) -> ContentPartEvent:
    return ContentPartEvent(
        type=event_type, sequence_number=out.number(), item_id=item_id_, output_index=index, content_index=0, part=part
    )
