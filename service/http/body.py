"""Reading a request's JSON body defensively: size (compressed and decompressed), content type and encoding,
nesting depth, valid Unicode."""

from __future__ import annotations

import io
import json
import zlib
from typing import Any

import zstandard
from starlette.requests import Request

from service.errors import InvalidRequest, PayloadTooLarge, UnsupportedMediaType

# Deeper than any real request (a tool schema nests a few levels); parsers and renderers recurse.
MAX_DEPTH = 64


# Content-Encoding values a body may carry (Codex sends zstd); brotli would need a library this server lacks.
ENCODINGS = ("gzip", "x-gzip", "deflate", "zstd", "identity")


async def json_body(request: Request) -> Any:
    _check_content_type(request.headers.get("content-type"))
    encodings = _content_encodings(request.headers.get("content-encoding"))
    limit: int = request.app.state.settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"The request body exceeds {limit} bytes.")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise PayloadTooLarge(f"The request body exceeds {limit} bytes.")
    data = bytes(body)
    for encoding in reversed(encodings):  # applied in the order listed, so undone last first
        data = decompress(data, encoding, limit=limit)
    return parse_json(data)


def _content_encodings(header: str | None) -> list[str]:
    """The body's encodings, in the order they were applied; an unknown one is a 415 (as OpenAI answers)."""
    if header is None:
        return []
    encodings = [part.strip().lower() for part in header.split(",") if part.strip()]
    for encoding in encodings:
        if encoding not in ENCODINGS:
            raise UnsupportedMediaType(
                f"Unsupported Content-Encoding {encoding!r}: send the body uncompressed, or as gzip, deflate or zstd."
            )
    if len(encodings) > 3:  # nobody stacks more; each layer is another bounded pass
        raise UnsupportedMediaType("At most three Content-Encoding layers are accepted.")
    return encodings


def decompress(data: bytes, encoding: str, *, limit: int) -> bytes:
    """`data` decoded; the decompressed size counts against `limit` (a zip bomb is a 413 once `limit` bytes have
    come out, never more memory); a corrupt body is a 400."""
    try:
        if encoding in ("gzip", "x-gzip"):
            return _inflate(data, zlib.MAX_WBITS | 16, limit)
        if encoding == "deflate":
            try:
                return _inflate(data, zlib.MAX_WBITS, limit)  # HTTP's deflate: a zlib stream
            except zlib.error:
                return _inflate(data, -zlib.MAX_WBITS, limit)  # what some clients send: raw deflate
        if encoding == "zstd":
            return _unzstd(data, limit)
    except (zlib.error, zstandard.ZstdError, EOFError):
        raise InvalidRequest(
            f"The request body is not valid {encoding} data (Content-Encoding: {encoding}).", code="invalid_body"
        ) from None
    return data  # identity


def _inflate(data: bytes, wbits: int, limit: int) -> bytes:
    out = bytearray()
    while data:
        stream = zlib.decompressobj(wbits)
        out += stream.decompress(data, limit + 1 - len(out))
        if len(out) > limit or stream.unconsumed_tail:
            raise _too_large_decompressed(limit)
        if not stream.eof:
            raise EOFError("truncated")
        data = stream.unused_data  # gzip allows members one after another
    return bytes(out)


def _unzstd(data: bytes, limit: int) -> bytes:
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True)
    out = bytearray()
    while chunk := reader.read(min(1 << 20, limit + 1 - len(out))):
        out += chunk
        if len(out) > limit:
            raise _too_large_decompressed(limit)
    return bytes(out)


def _too_large_decompressed(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"The request body exceeds {limit} bytes once decompressed.")


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
