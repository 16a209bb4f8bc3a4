"""Ids of responses and of the items in them."""

from __future__ import annotations

import hashlib
import re
import secrets

_RESPONSE_ID = re.compile(r"resp_[A-Za-z0-9_-]{1,59}")


def new_response_id() -> str:
    return "resp_" + secrets.token_hex(24)


def derived_id(prefix: str, response_id: str, key: str) -> str:
    """Item ids are a pure function of (response, position) so a replayed run names items identically."""
    digest = hashlib.sha256(f"{response_id}:{key}".encode()).hexdigest()[:40]
    return f"{prefix}_{digest}"


def is_response_id(value: str) -> bool:
    """Whether `value` can name a response at all (anything else is not found without a query)."""
    return _RESPONSE_ID.fullmatch(value) is not None
