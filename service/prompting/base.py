"""The chat-format contract: how a conversation becomes prompt tokens and how
sampled tokens become output items. One strategy object per model format
(Harmony for gpt-oss-style models, a transformers chat template for others),
instead of `if use_harmony` branches everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from service.engine.base import LogitsConstraint

OutputKind = Literal["reasoning", "message", "function_call"]

# Conversation items use the OpenAI Responses JSON shapes (plain dicts):
#   {"type": "message", "role": "user"|"assistant"|"system"|"developer",
#    "content": [{"type": "input_text"|"output_text", "text": ...}, ...]}
#   {"type": "function_call", "call_id": ..., "name": ..., "arguments": "..."}
#   {"type": "function_call_output", "call_id": ..., "output": "..."}
#   {"type": "reasoning", "content": [{"type": "reasoning_text", "text": ...}], "summary": [...]}
ConversationItem = dict[str, Any]
# Function tools in the Responses shape: {"type": "function", "name", "description", "parameters", "strict"}
FunctionTool = dict[str, Any]


@dataclass(frozen=True)
class PromptRequest:
    items: list[ConversationItem]  # the whole chain: earlier inputs and outputs, then the new input
    instructions: str | None = None
    tools: tuple[FunctionTool, ...] = ()
    reasoning_effort: Literal["low", "medium", "high"] = "medium"
    # text.format when it is not plain text ({"type": "json_schema", "name", "schema", ...} or json_object):
    # a format may tell the model about it in the prompt (the decoder enforces it either way).
    response_format: dict[str, Any] | None = None


@dataclass(frozen=True)
class ItemStarted:
    kind: OutputKind
    name: str | None = None  # function name for function_call


@dataclass(frozen=True)
class ItemDelta:
    text: str  # reasoning text, message text, or function-call arguments


@dataclass(frozen=True)
class ItemEnded:
    pass


OutputChunk = ItemStarted | ItemDelta | ItemEnded


class MalformedOutput(Exception):
    """The model produced tokens that cannot be parsed in this format."""


class OutputParser(Protocol):
    """Incremental: token ids in, output chunks out. Items never interleave:
    ItemStarted, ItemDelta*, ItemEnded, then the next item."""

    def feed(self, token_id: int) -> list[OutputChunk]: ...

    def finish(self) -> list[OutputChunk]:
        """The stream ended (stop token, length, cancel): close any open item."""
        ...


class ChatFormat(Protocol):
    name: str  # "harmony" | "chat_template"

    def render(self, request: PromptRequest) -> list[int]:
        """Prompt token ids, ending where the assistant's completion begins."""
        ...

    def stop_token_ids(self) -> frozenset[int]: ...

    def new_parser(self) -> OutputParser: ...

    def new_constraint(self) -> LogitsConstraint | None:
        """A fresh grammar for one completion, or None when the format needs none."""
        ...

    def count_tokens(self, text: str) -> int: ...

    def token_text(self, token_id: int) -> str:
        """One token as text (for logprobs); a token that is part of a UTF-8 sequence decodes lossily."""
        ...


def next_turn_prefix(chat_format: ChatFormat, request: PromptRequest, outputs: list[ConversationItem]) -> list[int]:
    """The tokens the next turn's prompt will start with, once `outputs` have answered `request`: the
    conversation with them appended, up to where the next message's text begins. Two renderings that
    differ only in that message's text agree up to there (the format's own rendering, so a dropped
    reasoning item or a re-tokenized answer comes out as the next turn will have it)."""

    def followed_by(text: str) -> list[int]:
        message = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
        return chat_format.render(replace(request, items=[*request.items, *outputs, message]))

    first, second = followed_by("x"), followed_by("y")
    common = next((i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b), len(first))
    return first[:common]
