"""The `include` view (service/http/include_view.py): code interpreter outputs are cut from what is sent, never
from what is logged."""

from __future__ import annotations

import json
from typing import Any

from service.http.include_view import hide_event_outputs, hide_outputs
from service.store.event_log import StoredEvent

CALL: dict[str, Any] = {
    "type": "code_interpreter_call",
    "id": "ci_1",
    "code": "print(1)",
    "outputs": [{"type": "logs", "logs": "1"}],
}


def test_outputs_are_null_wherever_the_item_appears() -> None:
    response: dict[str, Any] = {"object": "response", "output": [CALL, {"type": "message", "outputs": "kept"}]}
    hidden = hide_outputs(response)
    assert hidden["output"][0]["outputs"] is None and hidden["output"][0]["code"] == "print(1)"
    assert hidden["output"][1]["outputs"] == "kept", "other items are untouched"
    assert response["output"][0]["outputs"] == CALL["outputs"], "the input is not changed"
    assert hide_outputs({"data": [CALL]})["data"][0]["outputs"] is None


def test_stored_events_are_rewritten_only_when_they_carry_a_call() -> None:
    done: dict[str, Any] = {"type": "response.output_item.done", "sequence_number": 4, "output_index": 0, "item": CALL}
    stored = StoredEvent(1, "resp_1", 4, done["type"], json.dumps(done))
    shown = hide_event_outputs(stored)
    assert shown.payload()["item"]["outputs"] is None and shown.sequence_number == 4
    assert stored.payload()["item"]["outputs"] == CALL["outputs"]
    delta = StoredEvent(2, "resp_1", 5, "response.output_text.delta", '{"delta":"hi"}')
    assert hide_event_outputs(delta) is delta
