"""The text configuration of a request: the format the final answer must take."""

from __future__ import annotations

from typing import Literal

from service.protocol.base import Strict


class TextFormat(Strict):
    type: Literal["text"]


class TextConfig(Strict):
    format: TextFormat | None = None
