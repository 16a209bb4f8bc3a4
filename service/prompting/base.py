"""The chat-format contract: how a conversation becomes prompt tokens and how
sampled tokens become output items. One strategy object per model format
(Harmony for gpt-oss-style models, a transformers chat template for others),
instead of `if use_harmony` branches everywhere.
"""

from __future__ import annotations

import abc
import copy
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

from service.engine.base import LogitsConstraint
from service.engine.prefix_cache import common_prefix_length

if TYPE_CHECKING:
    import llguidance

    from service.constraints.plan import DecodingPlan

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


class ChatFormat(abc.ABC):
    """What every format does (the abstract methods), then what a format may be able to do: each capability
    has an explicit "unsupported" default here, so callers ask the format instead of sniffing for attributes."""

    name: str  # "harmony" | "chat_template"
    # MCP server labels a request with a code_interpreter tool may not use: the code interpreter's own namespace in
    # this format's tool list (a chat template's `code_interpreter.python`). Default: none.
    reserved_server_labels: frozenset[str] = frozenset()

    @abc.abstractmethod
    def render(self, request: PromptRequest) -> list[int]:
        """Prompt token ids, ending where the assistant's completion begins."""

    @abc.abstractmethod
    def stop_token_ids(self) -> frozenset[int]: ...

    @abc.abstractmethod
    def new_parser(self) -> OutputParser: ...

    @abc.abstractmethod
    def new_constraint(self) -> LogitsConstraint | None:
        """A fresh grammar for one completion, or None when the format needs none."""

    @abc.abstractmethod
    def encode_text(self, text: str) -> list[int]:
        """Plain text (special tokens in it taken as text) as the format tokenizes a message's text."""

    @abc.abstractmethod
    def count_tokens(self, text: str) -> int: ...

    @abc.abstractmethod
    def token_text(self, token_id: int) -> str:
        """One token as text (for logprobs); a token that is part of a UTF-8 sequence decodes lossily."""

    # -- capabilities, each with its "unsupported" default ----------------------------------------------------------

    def grammar_tokenizer(self) -> llguidance.LLTokenizer | None:
        """The llguidance tokenizer over this format's vocabulary; None (the default): the format cannot
        constrain its output, so structured outputs, custom tools, strict functions and forced tool_choice are
        refused (ModelRuntime.check_constraints)."""
        return None

    def refuse_plan(self, plan: DecodingPlan) -> tuple[str, str] | None:
        """(message, param) when a decoding plan needs what this format cannot enforce; None (the default): what
        compiles for its grammar tokenizer can be enforced."""
        return None

    def constraint_for(self, request: PromptRequest, plan: DecodingPlan | None = None) -> LogitsConstraint | None:
        """A fresh constraint for one completion of `request` under `plan` (None: a run logged before constrained
        decoding existed). Default: `new_constraint()`, the format's own grammar, whatever the request and plan."""
        return self.new_constraint()

    def server_tool_result_tokens(self, namespace: str, name: str, text: str) -> list[int]:
        """The tokens that continue a run after its call to server-side tool `namespace` (an MCP server_label, or
        `python`) `name` returned `text`: a pure function of these, so replay rebuilds the same continuation.
        Default: server-side tools are not supported (NotImplementedError, which fails the run)."""
        raise NotImplementedError(f"server-side tools are not supported by the {self.name} format")

    def approved_call_prompt(self, request: PromptRequest, prompt_ids: list[int]) -> list[int] | None:
        """The prompt of a run that starts by executing the approved MCP call `request`'s items end with
        (`prompt_ids` rendered from them), cut where that call ends; None when the items do not end so, and
        (the default) when the format cannot start a run at an approved call."""
        return None


def next_turn_prefix(chat_format: ChatFormat, request: PromptRequest, outputs: list[ConversationItem]) -> list[int]:
    """The tokens the next turn's prompt will start with, once `outputs` have answered `request`: the
    conversation with them appended, up to where the next message's text begins. Two renderings that
    differ only in that message's text agree up to there (the format's own rendering, so a dropped
    reasoning item or a re-tokenized answer comes out as the next turn will have it)."""

    def followed_by(text: str) -> list[int]:
        message = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
        return chat_format.render(replace(request, items=[*request.items, *outputs, message]))

    first, second = followed_by("x"), followed_by("y")
    return first[: common_prefix_length(first, second)]


class PartialTurn:
    """The tokens a conversation's next turn will surely start with while this turn's output still grows (what
    is warmed as a continued conversation decodes), for one run.

    Rendering a long conversation takes milliseconds, too much to redo every few tokens. Items never
    interleave and only the last one grows, so the conversation up to where the last item's text begins (the
    head) is rendered once for each item (the format's own rendering, as next_turn_prefix), and the text so
    far is encoded alone and appended, less its last word (it may still grow or merge into the next) and one
    token of margin. A wrong guess (a format that joins the text with what precedes it) costs only warming:
    the next turn's prompt is matched token for token."""

    def __init__(self, chat_format: ChatFormat, request: PromptRequest) -> None:
        self.chat_format = chat_format
        self.request = request
        self._item_count = 0
        self._head: list[int] = []

    def prefix(self, outputs: list[ConversationItem]) -> list[int]:
        text = _text_of(outputs[-1]) if outputs else None
        if text is None:
            return []
        if len(outputs) != self._item_count:
            self._item_count = len(outputs)
            self._head = self._text_start(outputs)
        body = self.chat_format.encode_text(text[: max(text.rfind(" "), text.rfind("\n"), 0)])
        return self._head + body[:-1]

    def _text_start(self, outputs: list[ConversationItem]) -> list[int]:
        """The next turn's tokens up to where the last output item's text begins."""
        message = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "z"}]}

        def with_text(text: str) -> list[int]:
            items = [*self.request.items, *outputs[:-1], _with_text(outputs[-1], text), message]
            return self.chat_format.render(replace(self.request, items=items))

        first, second = with_text("x"), with_text("y")
        return first[: common_prefix_length(first, second)]


_TEXT_FIELDS = ("arguments", "input", "code")  # function / custom / code interpreter calls


def _text_of(item: ConversationItem) -> str | None:
    """The item's growing text: a call's arguments (input, code), or its last content part's text."""
    for key in _TEXT_FIELDS:
        if isinstance(item.get(key), str):
            return str(item[key])
    parts = item.get("content")
    if isinstance(parts, list) and parts and isinstance(parts[-1], dict) and isinstance(parts[-1].get("text"), str):
        return str(parts[-1]["text"])
    return None


def _with_text(item: ConversationItem, text: str) -> ConversationItem:
    item = copy.deepcopy(item)
    for key in _TEXT_FIELDS:
        if isinstance(item.get(key), str):
            item[key] = text
            return item
    item["content"][-1]["text"] = text
    return item
