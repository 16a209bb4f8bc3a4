"""`POST /v1/responses/compact`, and the compaction steps of `POST /v1/responses` (see service/compaction.py)."""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from service import compaction
from service.commands import Commands
from service.errors import InvalidRequest
from service.http.auth import request_project
from service.http.body import json_body
from service.http.include_view import open_reasoning
from service.item_references import resolve_references
from service.protocol.ids import new_response_id
from service.protocol.normalize import normalize_input
from service.protocol.requests import CreateResponseRequest, parse_create_request
from service.store import compaction_state

_COMPACT_PARAMS = tuple(compaction.CompactRequest.model_fields)


async def _key(request: Request) -> bytes:
    """The compaction HMAC key, read once per process (SERVICE_SECRET_KEY, else the database's stored key)."""
    key: bytes | None = getattr(request.app.state, "compaction_key", None)
    if key is None:
        commands: Commands = request.app.state.commands
        secret = commands.settings.secret_key
        key = compaction.compaction_key(secret, b"" if secret else await compaction_state.stored_key(commands.db))
        request.app.state.compaction_key = key
    return key


async def read_create_body(request: Request) -> Any:
    """The JSON body of a create/count request, with sealed reasoning opened and `compaction` items expanded."""
    # Sealed reasoning first: its errors name the client's own input index, before compaction renumbers.
    body = await open_reasoning(request, await json_body(request))
    if not isinstance(body, dict) or not isinstance(body.get("input"), list):
        return body  # no key read (nor database round trip) for requests without items
    commands: Commands = request.app.state.commands

    async def load(compaction_id: str, project: str) -> list[dict[str, Any]] | None:
        return await compaction_state.load_summary(commands.db, compaction_id, project=project)

    return await compaction.expand_input(body, await _key(request), load, project=request_project(request))


async def _items(commands: Commands, create: CreateResponseRequest, *, project: str) -> list[dict[str, Any]]:
    """The whole context of a request: the previous response's chain, then the input."""
    history = []
    if create.previous_response_id is not None:
        history = await commands.prompts.history(create.previous_response_id, project=project)
    # item_reference inputs stand for the stored items they name (a user message among them is kept verbatim).
    return history + await resolve_references(commands.db, normalize_input(create, new_response_id()), project=project)


async def _managed(
    request: Request, create: CreateResponseRequest
) -> tuple[CreateResponseRequest, list[dict[str, Any]], list[dict[str, Any]]] | None:
    """`context_management`: past compact_threshold prompt tokens, everything before the last user
    message (history included) is compacted; that message and what follows are kept verbatim.
    Returns (the new request, its summary, the dropped items), or None when nothing is compacted."""
    entry = create.context_management[0] if create.context_management else None
    if entry is None or entry.compact_threshold is None:
        return None
    if create.conversation is not None:
        raise InvalidRequest(
            "context_management cannot be combined with 'conversation' on this server.",
            param="context_management",
            code="unsupported_parameter",
        )
    commands: Commands = request.app.state.commands
    project = request_project(request)
    if await commands.count_input_tokens(create, project=project) <= entry.compact_threshold:
        return None
    items = await _items(commands, create, project=project)
    last_user = max((i for i, item in enumerate(items) if item.get("role") == "user"), default=len(items))
    head, tail = items[:last_user], items[last_user:]
    if not head:
        return None
    users, summary, dropped = compaction.compact(head)
    kept = [compaction.input_message(item) for item in users] + summary + tail
    managed = parse_create_request(
        {**create.model_dump(mode="json", exclude_none=True), "input": kept, "previous_response_id": None}
    )
    return managed, summary, dropped


async def manage_context(request: Request, create: CreateResponseRequest) -> CreateResponseRequest:
    """The request as `context_management` turns it (for counting: nothing is stored)."""
    managed = await _managed(request, create)
    return create if managed is None else managed[0]


async def managed_create(
    request: Request, create: CreateResponseRequest
) -> tuple[CreateResponseRequest, dict[str, Any] | None]:
    """Like manage_context, for a create: a compaction's state is stored and its `compaction` item,
    which the response carries first in its `output` (like OpenAI's), returned with the request."""
    managed = await _managed(request, create)
    if managed is None:
        return create, None
    create, summary, dropped = managed
    commands: Commands = request.app.state.commands
    project = request_project(request)
    stored = await compaction_state.save(commands.db, project=project, summary=summary, dropped=dropped)
    sealed = compaction.seal(await _key(request), project=project, compaction_id=stored)
    return create, {"id": stored, "type": "compaction", "encrypted_content": sealed}


async def compact_response(request: Request) -> Response:
    body = await read_create_body(request)
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    for name in body:
        if name not in _COMPACT_PARAMS:
            raise InvalidRequest(f"Unknown parameter: '{name}'.", param=name, code="unknown_parameter")
    if body.get("model") is None:
        raise InvalidRequest("Missing required parameter: 'model'.", param="model", code="missing_required_parameter")
    if body.get("input") is None and body.get("previous_response_id") is None:
        raise InvalidRequest(
            "Missing required parameter: 'input' (or 'previous_response_id').",
            param="input",
            code="missing_required_parameter",
        )
    params = {name: body[name] for name in _COMPACT_PARAMS if body.get(name) is not None}
    create = parse_create_request({"input": "-", **params})
    if body.get("input") is None:
        create = create.model_copy(update={"input": []})
    commands: Commands = request.app.state.commands
    project = request_project(request)
    input_tokens = await commands.count_input_tokens(create, project=project)
    users, summary, dropped = compaction.compact(await _items(commands, create, project=project))
    stored = await compaction_state.save(commands.db, project=project, summary=summary, dropped=dropped)
    sealed = compaction.seal(await _key(request), project=project, compaction_id=stored)
    output = [*users, {"id": stored, "type": "compaction", "encrypted_content": sealed}]
    return JSONResponse(
        {
            "id": compaction_state.new_compaction_id(),
            "object": "response.compaction",
            "created_at": int(time.time()),
            "output": output,
            "usage": {
                "input_tokens": input_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": 0,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": input_tokens,
            },
        }
    )


routes = [Route("/v1/responses/compact", compact_response, methods=["POST"])]
