"""Context compaction: `POST /v1/responses/compact`, `compaction` input items, `context_management`.

What compaction keeps (like OpenAI's compacted list: all user messages, then one `compaction` item):
every user message verbatim, in order; everything else (assistant replies, reasoning, tool calls and
their outputs, developer/system messages) is dropped and replaced by one assistant message, the
summary: how many items were dropped, and the text of the last assistant reply (at most
SUMMARY_CHARS characters). The `compaction` item's `encrypted_content` carries that summary, sealed:
`base64url(zlib(json)) "." base64url(HMAC-SHA256)`, bound to the project that compacted. Sent back as
an input item it is replaced by the summary message before the request is parsed, so the prompt the
model sees is: the user messages, then the summary, then what follows.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import zlib
from typing import Annotated, Any

from pydantic import Field

from service.errors import InvalidRequest
from service.protocol.base import Strict
from service.protocol.items import InputItem

SUMMARY_CHARS = 400
# Without SERVICE_SECRET_KEY, a key per process: compaction items then stop being valid at a restart.
_PROCESS_KEY = secrets.token_bytes(32)


class CompactRequest(Strict):
    """The body of `POST /v1/responses/compact` (documents it; the route validates the same fields)."""

    model: str
    input: str | Annotated[list[InputItem], Field(min_length=1)] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    prompt_cache_key: Annotated[str, Field(max_length=256)] | None = None


def compaction_key(secret_key: str | None) -> bytes:
    """The HMAC key: derived from SERVICE_SECRET_KEY (one purpose, one key), else per process."""
    if not secret_key:
        return _PROCESS_KEY
    return hashlib.sha256(b"compaction-v1\0" + secret_key.encode()).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def seal(key: bytes, *, project: str, items: list[dict[str, Any]]) -> str:
    """Opaque, authenticated `encrypted_content` for the kept context `items`."""
    body = _b64(zlib.compress(json.dumps({"v": 1, "items": items}, separators=(",", ":")).encode()))
    return f"{body}.{_b64(_mac(key, project, body))}"


def _mac(key: bytes, project: str, body: str) -> bytes:
    return hmac.new(key, f"{project}\0{body}".encode(), hashlib.sha256).digest()


def open_sealed(key: bytes, *, project: str, content: object, param: str) -> list[dict[str, Any]]:
    """The items a sealed `encrypted_content` stands for; a forged or altered one is a 400."""
    error = InvalidRequest(
        "The compaction item's encrypted_content is invalid: it was altered, comes from another project or "
        "server key, or was not produced by /v1/responses/compact.",
        param=param,
        code="invalid_encrypted_content",
    )
    if not isinstance(content, str) or content.count(".") != 1:
        raise error
    body, tag = content.split(".")
    try:
        valid = hmac.compare_digest(_unb64(tag), _mac(key, project, body))
        payload = json.loads(zlib.decompress(_unb64(body))) if valid else None
    except (binascii.Error, ValueError, zlib.error):
        raise error from None
    if not isinstance(payload, dict) or payload.get("v") != 1 or not isinstance(payload.get("items"), list):
        raise error
    return list(payload["items"])


def _text(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


def compact(items: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(user messages kept verbatim, the summary items the compaction item stands for)."""
    users = [item for item in items if item.get("type") == "message" and item.get("role") == "user"]
    dropped = [item for item in items if not (item.get("type") == "message" and item.get("role") == "user")]
    replies = [item for item in dropped if item.get("type") == "message" and item.get("role") == "assistant"]
    summary = f"[Earlier context compacted: {len(dropped)} item(s) dropped.]"
    if replies:
        last = _text(replies[-1])
        clipped = last if len(last) <= SUMMARY_CHARS else last[:SUMMARY_CHARS] + "…"
        summary += f" Last assistant reply: {clipped}"
    message = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": summary}]}
    return users, [message]


def expand_input(body: object, key: bytes, *, project: str) -> object:
    """The request body with each `compaction` input item replaced by the context it stands for."""
    if not isinstance(body, dict) or not isinstance(body.get("input"), list):
        return body
    if not any(isinstance(item, dict) and item.get("type") == "compaction" for item in body["input"]):
        return body
    expanded: list[Any] = []
    for index, item in enumerate(body["input"]):
        if isinstance(item, dict) and item.get("type") == "compaction":
            param = f"input[{index}].encrypted_content"
            expanded.extend(open_sealed(key, project=project, content=item.get("encrypted_content"), param=param))
        else:
            expanded.append(item)
    return {**body, "input": expanded}


def input_message(item: dict[str, Any]) -> dict[str, Any]:
    """A stored message item as an input item (no id/status), so that it can be sent again."""
    return {"type": "message", "role": item["role"], "content": item["content"]}
