"""Shared base of the wire models: unknown fields are rejected, never ignored, and values are
parsed strictly ("5" is not an integer, "true" is not a boolean)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
