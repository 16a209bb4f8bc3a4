"""The `include` view: what a client sees of stored items. As in OpenAI's API, a `code_interpreter_call`'s
`outputs` are null unless the request includes "code_interpreter_call.outputs". The log keeps them whole,
so a later retrieve with that include shows them; only what is sent is cut.

"reasoning.encrypted_content" adds each reasoning item's sealed reasoning (service/sealing.py), made here, at
the edge, for each sending: the log keeps reasoning in clear (subject to store/retention as every item), and its
events stay byte-for-byte replayable while each blob carries a fresh nonce."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from typing import Any

from starlette.requests import Request

from service.errors import InvalidRequest
from service.http.auth import request_project
from service.sealing import Sealer, is_sealed_reasoning, open_input
from service.store import compaction_state
from service.store.event_log import StoredEvent

CI_OUTPUTS = "code_interpreter_call.outputs"
ENCRYPTED_REASONING = "reasoning.encrypted_content"

# What `include` may name on reads (retrieve, conversation items).
INCLUDES = {
    "message.output_text.logprobs",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    CI_OUTPUTS,
    ENCRYPTED_REASONING,
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


async def reasoning_sealer(request: Request) -> Sealer:
    """The reasoning sealer, made once per process (SERVICE_SECRET_KEY, else the database's stored key)."""
    sealer: Sealer | None = getattr(request.app.state, "reasoning_sealer", None)
    if sealer is None:
        state = request.app.state
        secret = state.commands.settings.secret_key
        sealer = Sealer.from_settings(secret, b"" if secret else await compaction_state.stored_key(state.commands.db))
        state.reasoning_sealer = sealer
    return sealer


@dataclasses.dataclass(frozen=True)
class IncludeView:
    """What one client sees of stored responses, items and events, given what it included."""

    outputs: bool = False
    sealer: Sealer | None = None
    project: str = ""

    def value(self, value: Any) -> Any:
        """A Response, item or list of them as sent."""
        shown = value if self.outputs else hide_outputs(value)
        return shown if self.sealer is None else self._sealed(shown)

    def event(self, stored: StoredEvent) -> StoredEvent:
        """A stored event as sent: parsed only when it can carry an item the view changes."""
        shown = stored if self.outputs else hide_event_outputs(stored)
        if self.sealer is None or '"reasoning"' not in shown.data or shown.type == "response.output_item.added":
            return shown  # an added item is still empty: its reasoning is sealed when it is done
        data = json.dumps(self._sealed(json.loads(shown.data)), separators=(",", ":"), ensure_ascii=False)
        return dataclasses.replace(shown, data=data)

    def _sealed(self, value: Any) -> Any:
        """`value` with every reasoning item carrying its `encrypted_content`."""
        if isinstance(value, list):
            return [self._sealed(entry) for entry in value]
        if not isinstance(value, dict):
            return value
        shown = {key: self._sealed(entry) for key, entry in value.items()}
        if shown.get("type") == "reasoning" and self.sealer is not None:
            shown["encrypted_content"] = self.sealer.seal(shown, project=self.project)
        return shown


PLAIN_VIEW = IncludeView()  # nothing included


async def include_view(request: Request, includes: Iterable[str] | None) -> IncludeView:
    """The view of a request that included `includes` (a create's `include`, or a read's query values)."""
    wanted = set(includes or ())
    if ENCRYPTED_REASONING not in wanted:
        return IncludeView(outputs=CI_OUTPUTS in wanted)
    return IncludeView(
        outputs=CI_OUTPUTS in wanted, sealer=await reasoning_sealer(request), project=request_project(request)
    )


async def open_reasoning(request: Request, body: Any) -> Any:
    """The create body with sealed reasoning input items opened (service/sealing.py open_input); the
    sealer (and its key read) only for bodies that carry one."""
    if not isinstance(body, dict) or not isinstance(body.get("input"), list):
        return body
    if not any(is_sealed_reasoning(item) for item in body["input"]):
        return body
    return open_input(body, await reasoning_sealer(request), project=request_project(request))
