"""The text configuration of a request: the format the final answer must take."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from service.protocol.base import Strict


class TextFormat(Strict):
    type: Literal["text"]


class JsonObjectFormat(Strict):
    """Any JSON object."""

    type: Literal["json_object"]


class JsonSchemaFormat(Strict):
    """JSON matching `schema`; with `strict`, OpenAI's strict subset is required and enforced exactly."""

    model_config = ConfigDict(extra="forbid", serialize_by_alias=True)

    type: Literal["json_schema"]
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]
    # `schema` shadows a BaseModel attribute: keep the wire name through an alias.
    schema_: Annotated[dict[str, Any], Field(alias="schema")]
    description: str | None = None
    strict: bool | None = None


Format = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")]


class TextConfig(Strict):
    format: Format | None = None
    # Echoed as sent; a hint (see verbosity_hint): no length is enforced.
    verbosity: Literal["low", "medium", "high"] | None = None
