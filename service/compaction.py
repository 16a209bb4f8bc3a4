"""Context compaction: `POST /v1/responses/compact`, `compaction` input items, `context_management`.

What compaction keeps (like OpenAI's compacted list: all user messages, then one `compaction` item):
every user message verbatim, in order; everything else (assistant replies, reasoning, tool calls and
their outputs, developer/system messages) is dropped and replaced by one assistant message, the
summary: how many items were dropped, and the text of the last assistant reply (at most
SUMMARY_CHARS characters). The summary and the dropped items are stored server-side (`compactions`
table, service/store/compaction_state.py); the `compaction` item's `encrypted_content` is only a reference
to that row, `base64url(json{v, id}) "." base64url(HMAC-SHA256(project \0 body))`, bound to the project
that compacted. Sent back as an input item it is replaced by the stored summary message before the
request is parsed, so the prompt the model sees is: the user messages, then the summary, then what follows.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from pydantic import Field

from service.errors import InvalidRequest
from service.protocol.base import Strict
from service.protocol.items import InputItem

SUMMARY_CHARS = 400
# Loads the summary items of a stored compaction (id, project); None when missing or another project's.
Loader = Callable[[str, str], Awaitable[list[dict[str, Any]] | None]]


class CompactRequest(Strict):
    """The body of `POST /v1/responses/compact` (documents it; the route validates the same fields)."""

    model: str
    input: str | Annotated[list[InputItem], Field(min_length=1)] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    prompt_cache_key: Annotated[str, Field(max_length=256)] | None = None


def compaction_key(secret_key: str | None, stored: bytes) -> bytes:
    """The HMAC key: derived from SERVICE_SECRET_KEY if set, else from the database's stored random key
    (shared by every replica and restart); one purpose, one key."""
    material = secret_key.encode() if secret_key else stored
    return hashlib.sha256(b"compaction-v2\0" + material).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def seal(key: bytes, *, project: str, compaction_id: str) -> str:
    """Opaque, authenticated `encrypted_content`: a reference to the stored compaction, bound to its project."""
    body = _b64(json.dumps({"v": 2, "id": compaction_id}, separators=(",", ":")).encode())
    return f"{body}.{_b64(_mac(key, project, body))}"


def _mac(key: bytes, project: str, body: str) -> bytes:
    return hmac.new(key, f"{project}\0{body}".encode(), hashlib.sha256).digest()


def _invalid(param: str, why: str) -> InvalidRequest:
    return InvalidRequest(
        f"The compaction item's encrypted_content is invalid: {why}", param=param, code="invalid_encrypted_content"
    )


def open_sealed(key: bytes, *, project: str, content: object, param: str) -> str:
    """The compaction id a sealed `encrypted_content` refers to; a forged or altered one is a 400."""
    error = _invalid(
        param,
        "it was altered, comes from another project or server key, or was not produced by /v1/responses/compact.",
    )
    if not isinstance(content, str) or content.count(".") != 1:
        raise error
    body, tag = content.split(".")
    try:
        valid = hmac.compare_digest(_unb64(tag), _mac(key, project, body))
        payload = json.loads(_unb64(body)) if valid else None
    except (binascii.Error, ValueError):
        raise error from None
    if not isinstance(payload, dict) or payload.get("v") != 2 or not isinstance(payload.get("id"), str):
        raise error
    return str(payload["id"])


def _text(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


def compact(
    items: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(user messages kept verbatim, the summary items the compaction item stands for, the items dropped)."""
    users = [item for item in items if item.get("type") == "message" and item.get("role") == "user"]
    dropped = [item for item in items if not (item.get("type") == "message" and item.get("role") == "user")]
    replies = [item for item in dropped if item.get("type") == "message" and item.get("role") == "assistant"]
    summary = f"[Earlier context compacted: {len(dropped)} item(s) dropped.]"
    if replies:
        last = _text(replies[-1])
        clipped = last if len(last) <= SUMMARY_CHARS else last[:SUMMARY_CHARS] + "…"
        summary += f" Last assistant reply: {clipped}"
    message = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": summary}]}
    return users, [message], dropped


async def expand_input(body: object, key: bytes, load: Loader, *, project: str) -> object:
    """The request body with each `compaction` input item replaced by the stored context it refers to."""
    if not isinstance(body, dict) or not isinstance(body.get("input"), list):
        return body
    if not any(isinstance(item, dict) and item.get("type") == "compaction" for item in body["input"]):
        return body
    expanded: list[Any] = []
    for index, item in enumerate(body["input"]):
        if isinstance(item, dict) and item.get("type") == "compaction":
            param = f"input[{index}].encrypted_content"
            compaction_id = open_sealed(key, project=project, content=item.get("encrypted_content"), param=param)
            summary = await load(compaction_id, project)
            if summary is None:
                raise _invalid(param, "the compaction it refers to no longer exists (retention) on this server.")
            expanded.extend(summary)
        else:
            expanded.append(item)
    return {**body, "input": expanded}


def input_message(item: dict[str, Any]) -> dict[str, Any]:
    """A stored message item as an input item (no id/status), so that it can be sent again."""
    return {"type": "message", "role": item["role"], "content": item["content"]}
