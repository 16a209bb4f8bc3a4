"""The `include` view: what a client sees of stored items. As in OpenAI's API, a `code_interpreter_call`'s
`outputs` are null unless the request includes "code_interpreter_call.outputs". The log keeps them whole,
so a later retrieve with that include shows them; only what is sent is cut."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from starlette.requests import Request

from service.errors import InvalidRequest
from service.store.event_log import StoredEvent

CI_OUTPUTS = "code_interpreter_call.outputs"

# What `include` may name on reads (retrieve, conversation items).
INCLUDES = {
    "message.output_text.logprobs",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    CI_OUTPUTS,
    "reasoning.encrypted_content",
}


def query_includes(request: Request) -> set[str]:
    """`include` (or `include[]`) query values, each one OpenAI knows; 400 otherwise."""
    values = request.query_params.getlist("include") + request.query_params.getlist("include[]")
    for value in values:
        if value not in INCLUDES:
            raise InvalidRequest(f"Invalid value for 'include': {value!r}.", param="include", code="invalid_value")
    return set(values)


def hide_outputs(value: Any) -> Any:
    """`value` (a Response, event, item or list of them) with every code_interpreter_call's outputs null."""
    if isinstance(value, list):
        return [hide_outputs(entry) for entry in value]
    if not isinstance(value, dict):
        return value
    shown = {key: hide_outputs(entry) for key, entry in value.items()}
    if shown.get("type") == "code_interpreter_call" and "outputs" in shown:
        shown["outputs"] = None
    return shown


def hide_event_outputs(stored: StoredEvent) -> StoredEvent:
    """The stored event as sent without the include: parsed only when it can carry such an item."""
    if '"code_interpreter_call"' not in stored.data:
        return stored
    data = json.dumps(hide_outputs(json.loads(stored.data)), separators=(",", ":"), ensure_ascii=False)
    return dataclasses.replace(stored, data=data)
