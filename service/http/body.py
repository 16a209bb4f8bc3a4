"""Reading a request's JSON body defensively: size, content type, nesting depth, valid Unicode."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from service.errors import InvalidRequest, PayloadTooLarge, UnsupportedMediaType

# Deeper than any real request (a tool schema nests a few levels); parsers and renderers recurse.
MAX_DEPTH = 64


async def json_body(request: Request) -> Any:
    _check_content_type(request.headers.get("content-type"))
    limit: int = request.app.state.settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"The request body exceeds {limit} bytes.")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise PayloadTooLarge(f"The request body exceeds {limit} bytes.")
    return parse_json(bytes(body))


def parse_json(body: bytes) -> Any:
    try:
        value = json.loads(body, parse_constant=_reject_constant)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
        raise InvalidRequest(
            "We could not parse the JSON body of your request. Send valid JSON.", code="invalid_json"
        ) from None
    except RecursionError:
        raise _too_deep() from None
    if _depth(value) > MAX_DEPTH:
        raise _too_deep()
    try:
        # A lone surrogate (e.g. "\ud800") is valid JSON but not text: nothing downstream can encode it.
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest(
            "The request contains a lone UTF-16 surrogate (e.g. \\ud800), which is not valid text.",
            code="invalid_json",
        ) from None
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _check_content_type(content_type: str | None) -> None:
    if content_type is None:
        return
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/json" or (media.startswith("application/") and media.endswith("+json")):
        return
    raise UnsupportedMediaType(f"Unsupported Content-Type {media!r}: send the request body as application/json.")


def _depth(value: Any) -> int:
    """Nesting depth of containers, without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        current, depth = stack.pop()
        if isinstance(current, dict):
            children: Any = current.values()
        elif isinstance(current, list):
            children = current
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _too_deep() -> InvalidRequest:
    return InvalidRequest(
        f"The JSON body is nested more than {MAX_DEPTH} levels deep; this server does not accept it.",
        code="invalid_json",
    )
