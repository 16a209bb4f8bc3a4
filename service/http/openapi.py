"""`GET /openapi.json`: what the server accepts and returns, generated from the pydantic models
(the create request as validated; the Response object, its items and stream events from the models the
server builds them from, service/protocol/output.py, events.py and response_object.py; the HTTP envelopes
of openapi_models.py), in OpenAI's shapes."""

from __future__ import annotations

import copy
import functools
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from service.compaction import CompactRequest
from service.conversations.protocol import AddItemsRequest, CreateConversationRequest, UpdateConversationRequest
from service.http import container_routes as containers
from service.http import openapi_models as m
from service.http.include_view import INCLUDES
from service.protocol import CreateResponseRequest
from service.protocol.events import StreamEvent
from service.protocol.response_object import ResponseObject

_REF = "#/components/schemas/{model}"
_MODELS: list[type[BaseModel]] = [
    CreateResponseRequest,
    CompactRequest,
    m.CompactedResponse,
    ResponseObject,
    m.DeletedResponse,
    m.InputItemList,
    m.Model,
    m.ModelList,
    m.ErrorResponse,
    m.Health,
    m.Ready,
    StreamEvent,
    CreateConversationRequest,
    UpdateConversationRequest,
    AddItemsRequest,
    m.Conversation,
    m.DeletedConversation,
    m.ConversationItemList,
    containers.CreateContainerRequest,
    containers.Container,
    containers.ContainerList,
    containers.DeletedContainer,
    m.InputTokens,
]


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _json(model: type[BaseModel], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(model)}}}


_ERRORS = {
    "400": _json(m.ErrorResponse, "Invalid request"),
    "401": _json(m.ErrorResponse, "Missing or wrong API key (when the server has one)"),
    "404": _json(m.ErrorResponse, "Not found"),
    "413": _json(m.ErrorResponse, "Request body too large"),
    "415": _json(m.ErrorResponse, "The body is not application/json"),
    "429": _json(m.ErrorResponse, "A rate or concurrency limit (with Retry-After)"),
    "503": _json(m.ErrorResponse, "Shutting down, overloaded or the store is unavailable (with Retry-After)"),
}


# Each server-sent event: `event:` the type, `id:` the sequence number, `data:` the event JSON.
_SSE_EVENT = {
    "type": "object",
    "required": ["event", "data"],
    "properties": {
        "event": {"type": "string", "pattern": "^response\\.[a-z_.]+$"},
        "id": {"type": "string", "pattern": "^[0-9]+$"},
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": {"$ref": _REF.format(model=StreamEvent.__name__) + "/properties/event"},
        },
    },
}


def _path_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


def _operation(operation_id: str, summary: str, ok: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"operationId": operation_id, "summary": summary, "responses": {"200": ok, **_ERRORS}, **extra}


def _paths() -> dict[str, Any]:
    response = _json(ResponseObject, "The Response object")
    stream = {"text/event-stream": {"schema": _SSE_EVENT}}
    either = {"description": "The Response, or its events if stream=true", "content": {**response["content"], **stream}}
    body = {"required": True, "content": {"application/json": {"schema": _ref(CreateResponseRequest)}}}
    response_id = _path_param("response_id")
    return {
        "/v1/responses": {
            "post": _operation(
                "createResponse",
                "Create a model response",
                either,
                requestBody=body,
            )
        },
        "/v1/responses/{response_id}": {
            "get": _operation(
                "getResponse",
                "Retrieve a response, or replay its events from the log",
                either,
                parameters=[
                    response_id,
                    _query("stream", {"type": "boolean"}, "Replay the stored events as server-sent events."),
                    _query("starting_after", {"type": "integer", "minimum": -1}, "Resume after this event."),
                    _query("include_obfuscation", {"type": "boolean"}, "Pad delta events with `obfuscation`."),
                    _query(
                        "include",
                        {"type": "array", "items": {"type": "string", "enum": sorted(INCLUDES)}},
                        "`code_interpreter_call.outputs` shows code interpreter outputs (null otherwise).",
                    ),
                ],
            ),
            "delete": _operation(
                "deleteResponse", "Delete a response", _json(m.DeletedResponse, "Deleted"), parameters=[response_id]
            ),
        },
        "/v1/responses/{response_id}/cancel": {
            "post": _operation("cancelResponse", "Cancel a background response", response, parameters=[response_id])
        },
        "/v1/responses/{response_id}/input_items": {
            "get": _operation(
                "listInputItems",
                "List a response's input items",
                _json(m.InputItemList, "A page of input items"),
                parameters=[
                    response_id,
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": 100}, "Page size."),
                    _query("order", {"type": "string", "enum": ["asc", "desc"]}, "Item order."),
                    _query("after", {"type": "string"}, "An item id to list after."),
                    _query("before", {"type": "string"}, "An item id to list before."),
                ],
            )
        },
        "/v1/responses/input_tokens": {
            "post": _operation(
                "getInputTokenCounts",
                "Count the input tokens a create request would use",
                _json(m.InputTokens, "The count"),
                requestBody=body,
            )
        },
        "/v1/responses/compact": {
            "post": _operation(
                "compactResponse",
                "Compact a conversation: its user messages, then one sealed compaction item",
                _json(m.CompactedResponse, "The compacted item list"),
                requestBody=_body(CompactRequest),
            )
        },
        **_conversation_paths(),
        **_container_paths(),
        "/v1/models": {"get": _operation("listModels", "List models", _json(m.ModelList, "The served model"))},
        "/v1/models/{model_id}": {
            "get": _operation(
                "retrieveModel", "Retrieve a model", _json(m.Model, "The model"), parameters=[_path_param("model_id")]
            )
        },
        "/health": {"get": _operation("health", "Liveness", _json(m.Health, "Alive"))},
        "/ready": {
            "get": {
                "operationId": "ready",
                "summary": "Readiness: database reachable and migrated, model loaded, run loop alive",
                "responses": {"200": _json(m.Ready, "Ready"), "503": _json(m.Ready, "Not ready")},
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics",
                "responses": {
                    "200": {
                        "description": "Prometheus text format",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
    }


def _body(model: type[BaseModel]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": _ref(model)}}}


def _conversation_paths() -> dict[str, Any]:
    conversation = _json(m.Conversation, "The conversation")
    page = _json(m.ConversationItemList, "Items")
    conversation_id, item_id = _path_param("conversation_id"), _path_param("item_id")
    include = _query(
        "include",
        {"type": "array", "items": {"type": "string"}},
        "`code_interpreter_call.outputs` shows code interpreter outputs (null otherwise).",
    )
    return {
        "/v1/conversations": {
            "post": _operation(
                "createConversation",
                "Create a conversation",
                conversation,
                requestBody=_body(CreateConversationRequest),
            )
        },
        "/v1/conversations/{conversation_id}": {
            "get": _operation("getConversation", "Retrieve a conversation", conversation, parameters=[conversation_id]),
            "post": _operation(
                "updateConversation",
                "Update a conversation's metadata",
                conversation,
                parameters=[conversation_id],
                requestBody=_body(UpdateConversationRequest),
            ),
            "delete": _operation(
                "deleteConversation",
                "Delete a conversation and its items",
                _json(m.DeletedConversation, "Deleted"),
                parameters=[conversation_id],
            ),
        },
        "/v1/conversations/{conversation_id}/items": {
            "get": _operation(
                "listConversationItems",
                "List a conversation's items",
                page,
                parameters=[
                    conversation_id,
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": 100}, "Page size."),
                    _query("order", {"type": "string", "enum": ["asc", "desc"]}, "Item order."),
                    _query("after", {"type": "string"}, "An item id to list after."),
                    include,
                ],
            ),
            "post": _operation(
                "createConversationItems",
                "Add items to a conversation",
                page,
                parameters=[conversation_id, include],
                requestBody=_body(AddItemsRequest),
            ),
        },
        "/v1/conversations/{conversation_id}/items/{item_id}": {
            "get": _operation(
                "getConversationItem",
                "Retrieve an item",
                {"description": "The item", "content": _item_content()},
                parameters=[conversation_id, item_id, include],
            ),
            "delete": _operation(
                "deleteConversationItem",
                "Delete an item; returns the conversation",
                conversation,
                parameters=[conversation_id, item_id],
            ),
        },
    }


def _container_paths() -> dict[str, Any]:
    container = _json(containers.Container, "The container")
    container_id = _path_param("container_id")
    return {
        "/v1/containers": {
            "post": _operation(
                "createContainer",
                "Create a code-interpreter container of the key's project",
                container,
                requestBody=_body(containers.CreateContainerRequest),
            ),
            "get": _operation(
                "listContainers",
                "List the project's containers",
                _json(containers.ContainerList, "A page of containers"),
                parameters=[
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": 100}, "Page size."),
                    _query("order", {"type": "string", "enum": ["asc", "desc"]}, "Order by creation."),
                    _query("after", {"type": "string"}, "A container id to list after."),
                    _query("name", {"type": "string"}, "Only containers of this name."),
                ],
            ),
        },
        "/v1/containers/{container_id}": {
            "get": _operation("retrieveContainer", "Retrieve a container", container, parameters=[container_id]),
            "delete": _operation(
                "deleteContainer",
                "Delete a container and its files",
                _json(containers.DeletedContainer, "Deleted"),
                parameters=[container_id],
            ),
        },
    }


def _item_content() -> dict[str, Any]:
    item = {"$ref": _REF.format(model="ConversationItemList") + "/properties/data/items"}
    return {"application/json": {"schema": item}}


@functools.cache
def openapi_document() -> dict[str, Any]:
    _, defs = models_json_schema([(model, "validation") for model in _MODELS], ref_template=_REF)
    schemas: dict[str, Any] = defs.get("$defs", {})
    request = schemas[CreateResponseRequest.__name__]
    # null means "the default" for every parameter, as in OpenAI's API.
    for name, schema in request["properties"].items():
        if name != "input" and not _nullable(schema):
            request["properties"][name] = {"anyOf": [schema, {"type": "null"}]}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Responses service",
            "version": "1.0.0",
            "description": "The OpenAI Responses API, served from an event log. Parameters and objects follow "
            "OpenAI's types; parameters this server cannot honour are refused with a 400 naming them.",
        },
        "paths": _paths(),
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{}, {"bearer": []}],
    }


def _nullable(schema: dict[str, Any]) -> bool:
    return schema.get("type") == "null" or any(option.get("type") == "null" for option in schema.get("anyOf", []))


async def openapi_json(_request: Request) -> Response:
    return JSONResponse(copy.deepcopy(openapi_document()))
