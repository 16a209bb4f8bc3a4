"""What the service runs on: an engine, its chat format and how to describe them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from service.constraints.compiler import DEFAULT_MAX_GRAMMAR_BYTES
from service.constraints.plan import check_plan, plan_from_spec
from service.engine.base import Engine, LogitsConstraint
from service.errors import InvalidRequest
from service.prompting.base import ChatFormat, PromptRequest


@dataclass
class ModelRuntime:
    model_id: str
    engine: Engine
    chat_format: ChatFormat
    # Reads the model's graph (format, ops, kernel path): a large graph takes a second to parse, so it
    # runs on first use (GET /v1/models) instead of in every start-up.
    describe_model: Callable[[], dict[str, Any]] | None = None
    _info: dict[str, Any] | None = field(default=None, init=False, repr=False)
    _info_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def info(self) -> dict[str, Any]:
        """The model's description, read once (blocking: call it from a worker thread in the server)."""
        with self._info_lock:
            if self._info is None:
                self._info = self.describe_model() if self.describe_model is not None else {}
            return self._info

    def render(self, request: PromptRequest) -> list[int]:
        return self.chat_format.render(request)

    def check_constraints(
        self, prompt_request: PromptRequest, spec: dict[str, Any], *, max_grammar_bytes: int = DEFAULT_MAX_GRAMMAR_BYTES
    ) -> None:
        """Raise InvalidRequest (400) unless every schema and grammar of the request compiles for this
        model, and unless the chat format can enforce what the request asks."""
        plan = plan_from_spec(list(prompt_request.tools), spec)
        tokenizer = self.chat_format.grammar_tokenizer()
        if tokenizer is None:
            if plan.constrains_content:
                raise InvalidRequest(
                    f"The {self.chat_format.name} format of this model cannot constrain its output: structured "
                    "outputs, custom tools, strict functions and forced tool_choice are not available.",
                    param="text.format" if plan.final_grammar is not None else "tool_choice",
                    code="unsupported_value",
                )
            return
        problem = self.chat_format.refuse_plan(plan)
        if problem is not None:
            raise InvalidRequest(problem[0], param=problem[1], code="unsupported_value")
        check_plan(plan, tokenizer, max_bytes=max_grammar_bytes)

    def new_constraint(
        self, prompt_request: PromptRequest, spec: dict[str, Any] | None = None
    ) -> LogitsConstraint | None:
        """A fresh constraint for one run. `spec` is the run's logged constraint fact (None for runs
        logged before constrained decoding existed: well-formed headers, any function call)."""
        plan = plan_from_spec(list(prompt_request.tools), spec) if spec is not None else None
        return self.chat_format.constraint_for(prompt_request, plan)
