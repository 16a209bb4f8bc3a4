"""Tools a request offers the model, and how it may choose among them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from service.protocol.base import Strict


class FunctionTool(Strict):
    type: Literal["function"]
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionToolChoice(Strict):
    type: Literal["function"]
    name: str
