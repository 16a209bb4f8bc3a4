"""Pure folds over the log: no I/O. `project` turns a response's client events into the
Response object a client GETs; `finished_output` lists its finished output items.

It folds the events as the log holds them (dicts, the dumps of service/protocol/events.py's models): an
item is copied whole from `output_item.added`/`.done`, and each delta extends the field its event's model
names (`_APPENDS`)."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from service.protocol import TERMINAL_EVENT_TYPES
from service.protocol.events import (
    CodeInterpreterCodeDeltaEvent,
    CustomToolCallInputDeltaEvent,
    FunctionCallArgumentsDeltaEvent,
    McpCallArgumentsDeltaEvent,
    OutputTextDeltaEvent,
    ReasoningTextDeltaEvent,
    event_types,
)

Event = dict[str, Any]

# Deltas of a content part's text (with its logprobs, if any).
_TEXT_DELTAS = event_types(OutputTextDeltaEvent, ReasoningTextDeltaEvent)
# Deltas of an item's own field: the event type -> the field its delta extends.
_APPENDS: dict[str, str] = {
    **dict.fromkeys(event_types(FunctionCallArgumentsDeltaEvent, McpCallArgumentsDeltaEvent), "arguments"),
    **dict.fromkeys(event_types(CustomToolCallInputDeltaEvent), "input"),
    **dict.fromkeys(event_types(CodeInterpreterCodeDeltaEvent), "code"),
}


def project(events: Iterable[Event], base: dict[str, Any] | None = None) -> dict[str, Any]:
    """Fold events (in sequence order) onto `base` (a Response snapshot, or None to start from scratch)."""
    response: dict[str, Any] | None = copy.deepcopy(base) if base is not None else None
    for event in events:
        response = apply(response, event)
    if response is None:
        raise ValueError("a response's log starts with response.created")
    return response


def apply(response: dict[str, Any] | None, event: Event) -> dict[str, Any]:
    kind = event["type"]
    if "response" in event and kind.startswith("response.") and isinstance(event["response"], dict):
        snapshot = copy.deepcopy(event["response"])
        if response is not None and kind not in TERMINAL_EVENT_TYPES:
            # Lifecycle events before the end carry no output; keep what the deltas built.
            snapshot["output"] = response.get("output", [])
        return snapshot
    if response is None:
        raise ValueError(f"event {kind} before response.created")
    output: list[dict[str, Any]] = response.setdefault("output", [])
    if kind == "response.output_item.added":
        index = event["output_index"]
        while len(output) <= index:
            output.append({})
        output[index] = copy.deepcopy(event["item"])
    elif kind == "response.output_item.done":
        output[event["output_index"]] = copy.deepcopy(event["item"])
    elif kind == "response.content_part.added":
        output[event["output_index"]].setdefault("content", []).append(copy.deepcopy(event["part"]))
    elif kind in _TEXT_DELTAS:
        part = output[event["output_index"]]["content"][event["content_index"]]
        part["text"] += event["delta"]
        if event.get("logprobs"):
            part.setdefault("logprobs", []).extend(copy.deepcopy(event["logprobs"]))
    elif kind == "response.reasoning_summary_part.added":
        output[event["output_index"]].setdefault("summary", []).append(copy.deepcopy(event["part"]))
    elif kind == "response.reasoning_summary_text.delta":
        output[event["output_index"]]["summary"][event["summary_index"]]["text"] += event["delta"]
    elif kind in _APPENDS:
        output[event["output_index"]][_APPENDS[kind]] += event["delta"]
    return response


def finished_output(events: Iterable[Event]) -> list[tuple[int, dict[str, Any]]]:
    """(output_index, item) of the output items that reached output_item.done, in output order."""
    done: dict[int, dict[str, Any]] = {}
    for event in events:
        if event["type"] == "response.output_item.done":
            done[event["output_index"]] = event["item"]
    return sorted(done.items(), key=lambda pair: pair[0])
