"""The stored form of a client event: token-level deltas are kept short, everything else as sent.

A delta event is one row per generated token, so its JSON dominates the log. Its `type` and
`sequence_number` are already columns, its `item_id` is a pure function of (response, output index)
(`protocol.derived_id`), `content_index` is 0 and `logprobs` is usually empty: the row keeps only
`[output_index, delta]` (or `[output_index, delta, logprobs]`) and `decode` rebuilds the exact JSON
that was sent, byte for byte. `encode` checks that round trip and stores the full JSON whenever it
would not hold, so any event shape the codec does not know is stored as sent. A stored form starting
with `[` is compact; one starting with `{` is the event JSON itself.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from service.protocol.ids import derived_id


@dataclass(frozen=True)
class _Shape:
    prefix: str  # of the item id
    content_index: bool  # the event carries `content_index` (always 0 when compact)
    logprobs: bool  # the event carries `logprobs` after `delta`


_DELTAS: dict[str, _Shape] = {
    "response.output_text.delta": _Shape("msg", True, True),
    "response.reasoning_text.delta": _Shape("rs", True, False),
    "response.function_call_arguments.delta": _Shape("fc", False, False),
    "response.custom_tool_call_input.delta": _Shape("ctc", False, False),
}


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


@functools.lru_cache(maxsize=4096)
def _item_id(prefix: str, response_id: str, output_index: int) -> str:
    return derived_id(prefix, response_id, f"output:{output_index}")


def _compact(response_id: str, event: dict[str, Any]) -> str | None:
    shape = _DELTAS.get(event.get("type", ""))
    output_index = event.get("output_index")
    if shape is None or not isinstance(output_index, int) or not isinstance(event.get("delta"), str):
        return None
    if event.get("item_id") != _item_id(shape.prefix, response_id, output_index):
        return None
    if shape.content_index and event.get("content_index") != 0:
        return None
    logprobs = event.get("logprobs") if shape.logprobs else None
    stored: list[Any] = [output_index, event["delta"]]
    if logprobs:
        stored.append(logprobs)
    return _json(stored)


def encode(response_id: str, event: dict[str, Any]) -> str:
    """The `events.data` to store for `event` (compact when decode gives back exactly what was sent)."""
    return encode_event(response_id, event).stored


@dataclass(frozen=True)
class EncodedEvent:
    """An event serialized once: `sent` is the JSON clients receive, `stored` its `events.data`."""

    response_id: str
    sequence_number: int
    type: str
    sent: str
    stored: str


def encode_event(response_id: str, event: dict[str, Any]) -> EncodedEvent:
    """Serialize `event` once for both the log and its live readers (the hot path of every token)."""
    sent = _json(event)
    compact = _compact(response_id, event) if _rebuildable(event) else None
    if (
        compact is not None
        and event.get("logprobs")
        and decode(response_id, event["type"], event["sequence_number"], compact) != sent
    ):
        compact = None  # logprobs are arbitrary JSON: checked by decoding (only runs that ask for them pay)
    return EncodedEvent(response_id, event["sequence_number"], event["type"], sent, compact or sent)


def _rebuildable(event: dict[str, Any]) -> bool:
    """decode would rebuild `event` exactly: the keys decode writes, in its order, with values whose JSON
    survives a round trip unchanged (checked by shape instead of decoding, since this runs per token)."""
    shape = _DELTAS.get(event.get("type", ""))
    if shape is None or type(event.get("sequence_number")) is not int or type(event.get("output_index")) is not int:
        return False
    keys = ["type", "sequence_number", "item_id", "output_index"]
    keys += ["content_index"] if shape.content_index else []
    keys += ["delta", "logprobs"] if shape.logprobs else ["delta"]
    if shape.content_index and type(event.get("content_index")) is not int:
        return False  # 0.0 == 0, but would not be sent as "0"
    return list(event) == keys and (not shape.logprobs or type(event["logprobs"]) is list)


def decode(response_id: str, event_type: str, sequence_number: int, data: str) -> str:
    """The event JSON as it was sent, from a stored `events.data` and its row's columns."""
    if not data.startswith("["):
        return data
    shape = _DELTAS[event_type]
    stored = json.loads(data)
    output_index, delta = stored[0], stored[1]
    event: dict[str, Any] = {
        "type": event_type,
        "sequence_number": sequence_number,
        "item_id": _item_id(shape.prefix, response_id, output_index),
        "output_index": output_index,
    }
    if shape.content_index:
        event["content_index"] = 0
    event["delta"] = delta
    if shape.logprobs:
        event["logprobs"] = stored[2] if len(stored) > 2 else []
    return _json(event)
