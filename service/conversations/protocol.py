"""Conversation request bodies and ids, in the official client's shapes."""

from __future__ import annotations

import re
import secrets
from typing import Annotated, Any, TypeVar

from pydantic import Field, ValidationError, field_validator

from service.errors import InvalidRequest
from service.protocol.base import Strict
from service.protocol.items import InputItem

_CONVERSATION_ID = re.compile(r"conv_[A-Za-z0-9_-]{1,59}")

MAX_ITEMS_PER_REQUEST = 20


def new_conversation_id() -> str:
    return "conv_" + secrets.token_hex(24)


def is_conversation_id(value: str) -> bool:
    return _CONVERSATION_ID.fullmatch(value) is not None


def _check_metadata(value: dict[str, str] | None) -> dict[str, str] | None:
    if value is not None:
        if len(value) > 16:
            raise ValueError("metadata may hold at most 16 pairs")
        for key, item in value.items():
            if len(key) > 64 or len(item) > 512:
                raise ValueError("metadata keys are at most 64 characters and values at most 512")
    return value


class CreateConversationRequest(Strict):
    items: Annotated[list[InputItem], Field(max_length=MAX_ITEMS_PER_REQUEST)] | None = None
    metadata: dict[str, str] | None = None

    _metadata = field_validator("metadata")(_check_metadata)


class UpdateConversationRequest(Strict):
    metadata: dict[str, str]

    _metadata = field_validator("metadata")(_check_metadata)


class AddItemsRequest(Strict):
    items: Annotated[list[InputItem], Field(min_length=1, max_length=MAX_ITEMS_PER_REQUEST)]


T = TypeVar("T", bound=Strict)


def parse(model: type[T], body: Any) -> T:
    """Validate a body; a bad one is a 400 naming the first offending field."""
    from service.protocol.requests import _invalid_from_validation, _refuse_unsupported_parts

    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    body = {name: value for name, value in body.items() if value is not None}
    if isinstance(body.get("items"), list):
        _refuse_unsupported_parts(body["items"])
        body["items"] = [
            {**item, "type": "message"} if isinstance(item, dict) and "type" not in item and "role" in item else item
            for item in body["items"]
        ]
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise _invalid_from_validation(exc) from None
