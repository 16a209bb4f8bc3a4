"""The stored form of events: token deltas are stored compact and read back byte for byte as sent."""

from __future__ import annotations

from typing import Any

from service.protocol import derived_id
from service.store import event_codec
from service.store.event_log import encode

RID = "resp_" + "ab" * 24


def _delta(event_type: str, prefix: str, **extra: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": event_type,
        "sequence_number": 7,
        "item_id": derived_id(prefix, RID, "output:1"),
        "output_index": 1,
    }
    if event_type in ("response.output_text.delta", "response.reasoning_text.delta"):
        event["content_index"] = 0
    event["delta"] = 'he said "é\\n"'
    event.update(extra)
    return event


def _round_trip(event: dict[str, Any]) -> str:
    stored = event_codec.encode(RID, event)
    assert event_codec.decode(RID, event["type"], event["sequence_number"], stored) == encode(event)
    return stored


def test_deltas_are_stored_as_output_index_and_text() -> None:
    cases = [
        _delta("response.output_text.delta", "msg", logprobs=[]),
        _delta("response.reasoning_text.delta", "rs"),
        _delta("response.function_call_arguments.delta", "fc"),
        _delta("response.custom_tool_call_input.delta", "ctc"),
    ]
    for event in cases:
        assert _round_trip(event) == '[1,"he said \\"é\\\\n\\""]'


def test_logprobs_are_kept_in_the_compact_form() -> None:
    logprobs = [{"token": "x", "bytes": [120], "logprob": -0.5, "top_logprobs": []}]
    stored = _round_trip(_delta("response.output_text.delta", "msg", logprobs=logprobs))
    assert stored.startswith("[1,") and '"logprob":-0.5' in stored


def test_anything_the_codec_cannot_rebuild_is_stored_as_sent() -> None:
    foreign_id = {**_delta("response.output_text.delta", "msg", logprobs=[]), "item_id": "msg_from_a_tool"}
    extra_field = _delta("response.output_text.delta", "msg", logprobs=[], obfuscation="xyz")
    other_part = {**_delta("response.reasoning_text.delta", "rs"), "content_index": 2}
    reordered = dict(reversed(list(_delta("response.function_call_arguments.delta", "fc").items())))
    created = {"type": "response.created", "sequence_number": 0, "response": {"id": RID}}
    for event in (foreign_id, extra_field, other_part, reordered, created):
        assert _round_trip(event) == encode(event)


def test_an_event_is_serialized_once_for_the_log_and_its_readers() -> None:
    logprobs = [{"token": "x", "bytes": [120], "logprob": -0.5, "top_logprobs": []}]
    cases = [
        _delta("response.output_text.delta", "msg", logprobs=[]),
        _delta("response.output_text.delta", "msg", logprobs=logprobs),
        _delta("response.reasoning_text.delta", "rs"),
        _delta("response.function_call_arguments.delta", "fc"),
        {**_delta("response.reasoning_text.delta", "rs"), "content_index": 0.0},  # equal to 0, sent as 0.0
        {**_delta("response.function_call_arguments.delta", "fc"), "output_index": True},
        _delta("response.output_text.delta", "msg", logprobs=None),  # decode would give []
        _delta("response.output_text.delta", "msg", logprobs=[{1: "a", "1": "b"}]),  # JSON that reads back changed
        {"type": "response.created", "sequence_number": 0, "response": {"id": RID}},
    ]
    for event in cases:
        encoded = event_codec.encode_event(RID, event)
        assert encoded.sent == encode(event)
        assert event_codec.decode(RID, event["type"], event["sequence_number"], encoded.stored) == encoded.sent
        assert (encoded.response_id, encoded.sequence_number, encoded.type) == (
            RID,
            event["sequence_number"],
            event["type"],
        )
    assert event_codec.encode_event(RID, cases[0]).stored.startswith("[")
    assert event_codec.encode_event(RID, cases[4]).stored.startswith("{")
