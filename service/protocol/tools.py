"""Tools a request offers the model, and how it may choose among them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from service.protocol.base import Strict

ToolName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]


class FunctionTool(Strict):
    type: Literal["function"]
    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class CustomTextFormat(Strict):
    type: Literal["text"]


class CustomGrammarFormat(Strict):
    type: Literal["grammar"]
    syntax: Literal["lark", "regex"]
    definition: str


class CustomTool(Strict):
    """A tool whose input is free text, or text matching a Lark grammar or a regex."""

    type: Literal["custom"]
    name: ToolName
    description: str | None = None
    format: Annotated[CustomTextFormat | CustomGrammarFormat, Field(discriminator="type")] | None = None


Tool = Annotated[FunctionTool | CustomTool, Field(discriminator="type")]


class FunctionToolChoice(Strict):
    type: Literal["function"]
    name: str


class CustomToolChoice(Strict):
    type: Literal["custom"]
    name: str


class AllowedToolRef(Strict):
    type: Literal["function", "custom"]
    name: str


class AllowedToolsChoice(Strict):
    """Restrict the model to a subset of `tools`; `required` forces one of them."""

    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[AllowedToolRef]


ToolChoice = (
    Literal["auto", "none", "required"]
    | Annotated[FunctionToolChoice | CustomToolChoice | AllowedToolsChoice, Field(discriminator="type")]
)
