"""HTTP routes of `/v1/conversations` and `POST /v1/responses/input_tokens`."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from service.commands import Commands
from service.conversations.protocol import (
    AddItemsRequest,
    CreateConversationRequest,
    UpdateConversationRequest,
    parse,
)
from service.conversations.service import Conversations
from service.errors import InvalidRequest
from service.http.auth import request_project
from service.http.body import json_body
from service.http.compaction_routes import manage_context, read_create_body
from service.http.include_view import CI_OUTPUTS, hide_outputs, query_includes
from service.http.paging import page_query
from service.protocol import CreateResponseRequest, parse_create_request


def _conversations(request: Request) -> Conversations:
    return Conversations(request.app.state.db)


async def create_conversation(request: Request) -> Response:
    body = parse(CreateConversationRequest, await json_body(request))
    return JSONResponse(await _conversations(request).create(body, project=request_project(request)))


async def conversation_resource(request: Request) -> Response:
    conversation_id = request.path_params["conversation_id"]
    conversations, project = _conversations(request), request_project(request)
    if request.method == "GET":
        return JSONResponse(await conversations.get(conversation_id, project=project))
    if request.method == "DELETE":
        return JSONResponse(await conversations.delete(conversation_id, project=project))
    body = parse(UpdateConversationRequest, await json_body(request))
    return JSONResponse(await conversations.update(conversation_id, body, project=project))


async def conversation_items(request: Request) -> Response:
    conversation_id = request.path_params["conversation_id"]
    conversations, project = _conversations(request), request_project(request)
    outputs = CI_OUTPUTS in query_includes(request)
    if request.method == "POST":
        body = parse(AddItemsRequest, await json_body(request))
        added = await conversations.add_items(conversation_id, body, project=project)
        return JSONResponse(added if outputs else hide_outputs(added))
    paging = page_query(request)
    page = await conversations.list_items(
        conversation_id, after=paging.after, limit=paging.limit, order=paging.order, project=project
    )
    return JSONResponse(page if outputs else hide_outputs(page))


async def conversation_item(request: Request) -> Response:
    conversation_id, item_id = request.path_params["conversation_id"], request.path_params["item_id"]
    conversations, project = _conversations(request), request_project(request)
    if request.method == "DELETE":
        return JSONResponse(await conversations.delete_item(conversation_id, item_id, project=project))
    outputs = CI_OUTPUTS in query_includes(request)
    item = await conversations.get_item(conversation_id, item_id, project=project)
    return JSONResponse(item if outputs else hide_outputs(item))


def _count_request(body: object) -> CreateResponseRequest:
    """A create request for counting: like OpenAI's, `input` may be left out when the history
    (`conversation` or `previous_response_id`) is the whole prompt."""
    if not isinstance(body, dict) or body.get("input") is not None:
        return parse_create_request(body)
    if body.get("conversation") is None and body.get("previous_response_id") is None:
        raise InvalidRequest(
            "Missing required parameter: 'input' (or 'conversation' or 'previous_response_id').",
            param="input",
            code="missing_required_parameter",
        )
    # Validated with a placeholder input, then counted with none.
    return parse_create_request({**body, "input": "-"}).model_copy(update={"input": []})


async def count_input_tokens(request: Request) -> Response:
    create = await manage_context(request, _count_request(await read_create_body(request)))
    commands: Commands = request.app.state.commands
    count = await commands.count_input_tokens(create, project=request_project(request))
    return JSONResponse({"object": "response.input_tokens", "input_tokens": count})


routes = [
    Route("/v1/responses/input_tokens", count_input_tokens, methods=["POST"]),
    Route("/v1/conversations", create_conversation, methods=["POST"]),
    Route("/v1/conversations/{conversation_id}", conversation_resource, methods=["GET", "POST", "DELETE"]),
    Route("/v1/conversations/{conversation_id}/items", conversation_items, methods=["GET", "POST"]),
    Route("/v1/conversations/{conversation_id}/items/{item_id}", conversation_item, methods=["GET", "DELETE"]),
]
