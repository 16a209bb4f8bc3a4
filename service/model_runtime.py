"""What the service runs on: an engine, its chat format and how to describe them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from service.engine.base import Engine, LogitsConstraint
from service.prompting.base import ChatFormat, PromptRequest


@dataclass
class ModelRuntime:
    model_id: str
    engine: Engine
    chat_format: ChatFormat
    info: dict[str, Any] = field(default_factory=dict)

    def render(self, request: PromptRequest) -> list[int]:
        return self.chat_format.render(request)

    def new_constraint(self, prompt_request: PromptRequest) -> LogitsConstraint | None:
        factory = getattr(self.chat_format, "constraint_for", None)
        if factory is not None:
            constraint: LogitsConstraint | None = factory(prompt_request)
            return constraint
        return self.chat_format.new_constraint()
