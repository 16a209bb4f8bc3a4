"""HTTP routes of `/v1/containers` (OpenAI's Containers API): the code interpreter's containers of the
request's project. Files inside a container are reached only by the code that runs in it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from service.containers import Containers
from service.conversations.protocol import parse
from service.errors import InvalidRequest, NotFound
from service.http.auth import request_project
from service.http.body import json_body
from service.http.paging import page_query
from service.protocol.base import Strict
from service.store.containers import DEFAULT_EXPIRY_MINUTES


class ContainerExpiresAfterParam(Strict):
    anchor: Literal["last_active_at"]
    minutes: Annotated[int, Field(ge=1, le=7 * 24 * 60)]


class ContainerNetworkPolicy(Strict):
    type: Literal["disabled", "allowlist"]
    allowed_domains: list[str] | None = None


class CreateContainerRequest(Strict):
    name: Annotated[str, Field(max_length=256)]
    expires_after: ContainerExpiresAfterParam | None = None
    file_ids: list[str] | None = None
    memory_limit: Literal["1g", "4g", "16g", "64g"] | None = None  # a hint: the sandbox has its own limits
    network_policy: ContainerNetworkPolicy | None = None
    skills: list[Any] | None = None


class ContainerExpiresAfter(BaseModel):
    anchor: Literal["last_active_at"]
    minutes: int


class Container(BaseModel):
    """The Container object (OpenAI's shape); `status` is `expired` once it idled past `expires_after`."""

    id: str
    object: Literal["container"]
    name: str
    created_at: int
    last_active_at: int
    status: Literal["running", "expired"]
    expires_after: ContainerExpiresAfter
    memory_limit: Literal["1g", "4g", "16g", "64g"]


class ContainerList(BaseModel):
    object: Literal["list"]
    data: list[Container]
    first_id: str | None
    last_id: str | None
    has_more: bool


class DeletedContainer(BaseModel):
    id: str
    object: Literal["container.deleted"]
    deleted: Literal[True]


def _containers(request: Request) -> Containers:
    containers: Containers = request.app.state.containers
    return containers


async def create_container(request: Request) -> Response:
    body = parse(CreateContainerRequest, await json_body(request))
    if body.file_ids:  # there is no Files API here, so no file id can exist
        raise NotFound(f"File with id '{body.file_ids[0]}' not found.", param="file_ids")
    if body.network_policy is not None and body.network_policy.type == "allowlist":
        raise InvalidRequest(
            "Code here runs without network access; only network_policy type 'disabled' is supported.",
            param="network_policy.type",
            code="unsupported_value",
        )
    if body.skills:
        raise InvalidRequest("Skills are not supported by this server.", param="skills", code="unsupported_value")
    minutes = body.expires_after.minutes if body.expires_after is not None else DEFAULT_EXPIRY_MINUTES
    created = await _containers(request).create(
        project=request_project(request), name=body.name, expires_after_minutes=minutes
    )
    return JSONResponse(created)


async def list_containers(request: Request) -> Response:
    paging = page_query(request)
    page = await _containers(request).list_page(
        project=request_project(request),
        after=paging.after,
        limit=paging.limit,
        order=paging.order,
        name=request.query_params.get("name"),
    )
    return JSONResponse(page)


async def containers_root(request: Request) -> Response:
    return await (create_container(request) if request.method == "POST" else list_containers(request))


async def container_resource(request: Request) -> Response:
    container_id, project = request.path_params["container_id"], request_project(request)
    if request.method == "DELETE":
        return JSONResponse(await _containers(request).delete(container_id, project=project))
    return JSONResponse(await _containers(request).get(container_id, project=project))


routes = [
    Route("/v1/containers", containers_root, methods=["GET", "POST"]),
    Route("/v1/containers/{container_id}", container_resource, methods=["GET", "DELETE"]),
]
