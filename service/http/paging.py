"""The query parameters of OpenAI's list endpoints (`limit`, `order`, `after`), checked once for every list."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from starlette.requests import Request

from service.errors import InvalidRequest

Order = Literal["asc", "desc"]


@dataclass(frozen=True)
class PageQuery:
    limit: int
    order: Order
    after: str | None


def page_query(request: Request) -> PageQuery:
    """`limit` 1..100 (default 20), `order` asc|desc (default desc), `after` as given; a 400 naming the bad one."""
    query = request.query_params
    raw_limit = query.get("limit", "20")
    if not (raw_limit.isascii() and raw_limit.isdigit()) or not 1 <= int(raw_limit) <= 100:
        raise InvalidRequest("limit must be an integer between 1 and 100.", param="limit")
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("order must be 'asc' or 'desc'.", param="order")
    return PageQuery(int(raw_limit), "asc" if order == "asc" else "desc", query.get("after"))
