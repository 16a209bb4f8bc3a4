"""The chat-template format for non-Harmony models: a transformers tokenizer's Jinja
chat template renders the prompt; the output is plain text (one "message" item)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llguidance

from service.constraints.compiler import GrammarError, compile_grammar
from service.constraints.matcher import GrammarMatcher
from service.constraints.plan import PYTHON_TARGET, DecodingPlan
from service.constraints.tokenizer import hf_tokenizer
from service.engine.base import LogitsConstraint
from service.prompting.base import (
    ChatFormat,
    ConversationItem,
    ItemDelta,
    ItemEnded,
    ItemStarted,
    OutputChunk,
    PromptRequest,
)
from service.prompting.chat_template_server_tools import (
    CODE_TOOL,
    code_tool,
    ends_with_approved_call,
    model_tool_name,
    result_text_after_turn,
    server_history_items,
)
from service.prompting.chat_template_tools import (
    CALL_OPEN,
    CompletionConstraint,
    ToolCallTextParser,
    completion_grammar,
)
from service.protocol.client_tools import as_function_item
from service.protocol.items import unseen_part_text

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
_REPLACEMENT = "\ufffd"


def _load_tokenizer(model_dir: Path) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the hub, even for a missing file
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoTokenizer  # heavy import: only for chat-template models

    return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)


def _text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif isinstance(part, str):
            parts.append(part)
        elif isinstance(part, dict) and part.get("type") == "refusal":
            parts.append(str(part.get("refusal", "")))  # an assistant's earlier refusal, as its text
        elif (unseen := unseen_part_text(part)) is not None:
            parts.append(unseen)  # a tool returned an image or a file: the model is told it cannot see it
        else:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ValueError(f"content part of type {kind!r} is not supported by the chat-template format")
    return "".join(parts)


def _arguments(raw: str) -> Any:
    # HF templates expect a dict (they `tojson` it); keep unparseable model output as a string.
    try:
        return json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return raw


def _hf_tool(tool: dict[str, Any]) -> dict[str, Any]:
    if tool.get("type") == "python":
        return code_tool(tool)
    fn = {"name": model_tool_name(tool), "description": tool.get("description") or ""}
    fn["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "function", "function": fn}


def items_to_chat_messages(
    request: PromptRequest, *, structured_tools: bool, tools_in_template: bool
) -> list[dict[str, Any]]:
    """Responses items -> HF chat messages.

    structured_tools: the template understands `tool_calls` and the `tool` role; otherwise calls
    and results become plain text turns. Reasoning items are dropped (no portable rendering).
    """
    system = request.instructions or ""
    if request.tools and not tools_in_template:
        listing = "\n".join(json.dumps(_hf_tool(t), ensure_ascii=False) for t in request.tools)
        system = (system + "\n\n" if system else "") + "# Tools\n" + listing
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    names: dict[str, str] = {}

    def append(role: str, content: str, **extra: Any) -> None:
        last = messages[-1] if messages else None
        # Merge adjacent same-role turns: many templates insist on alternation.
        if last is not None and last["role"] == role and role != "tool" and not extra and "tool_calls" not in last:
            last["content"] = (last["content"] + "\n\n" + content) if last["content"] else content
        else:
            messages.append({"role": role, "content": content, **extra})

    # Server-side tool calls read like function calls (chat_template_server_tools).
    for item in server_history_items([as_function_item(i) for i in request.items]):
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role", "user")
            append("system" if role == "developer" else role, _text_of(item.get("content")))
        elif kind == "reasoning":
            continue
        elif kind in ("function_call", "custom_tool_call"):
            names[item["call_id"]] = item["name"]
            args = item.get("arguments") or item.get("input") or ""
            if structured_tools:
                call = {
                    "id": item["call_id"],
                    "type": "function",
                    "function": {"name": item["name"], "arguments": _arguments(args)},
                }
                last = messages[-1] if messages else None
                if last is not None and last["role"] == "assistant":
                    last.setdefault("tool_calls", []).append(call)
                else:
                    messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            else:
                append("assistant", f"Calling function {item['name']} with arguments {args}")
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = _output_text(item)
            name = names.get(item["call_id"], "unknown")
            if structured_tools:
                messages.append({"role": "tool", "content": output, "tool_call_id": item["call_id"], "name": name})
            else:
                append("user", f"Function {name} returned: {output}")
        else:
            raise ValueError(f"conversation item of type {kind!r} is not supported by the chat-template format")
    return messages


def _output_text(item: ConversationItem) -> str:
    output = item.get("output")
    try:
        return _text_of(output)
    except (ValueError, TypeError):
        return json.dumps(output, ensure_ascii=False)


class IncrementalDetokenizer:
    """Token ids -> text deltas whose concatenation equals decoding all ids at once.

    Decodes a short window (ids since the last emitted boundary) rather than the whole
    output, so a step costs O(window); text ending in U+FFFD (an incomplete multi-byte
    character) is held back until the next token completes it.
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # window start: decoding from here gives context for leading spaces
        self._read = 0  # ids before this are already emitted

    def _decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False))

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        return self._emit(final=False)

    def flush(self) -> str:
        return self._emit(final=True)

    def _emit(self, *, final: bool) -> str:
        if self._read == len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        if len(new_text) > len(prefix_text) and (final or not new_text.endswith(_REPLACEMENT)):
            self._prefix, self._read = self._read, len(self._ids)
            return new_text[len(prefix_text) :]
        if final:
            self._prefix = self._read = len(self._ids)
        return ""


class PlainTextParser:
    """OutputParser: the whole completion is one "message" item; stop tokens are not text."""

    def __init__(self, tokenizer: Any, stop_ids: frozenset[int]) -> None:
        self._detok = IncrementalDetokenizer(tokenizer)
        self._stop = stop_ids
        self._state = "new"  # new -> open -> closed

    def feed(self, token_id: int) -> list[OutputChunk]:
        if self._state == "closed":
            return []
        out: list[OutputChunk] = []
        if self._state == "new":
            self._state = "open"
            out.append(ItemStarted("message"))
        if token_id in self._stop:
            return out + self._close()
        delta = self._detok.push(token_id)
        if delta:
            out.append(ItemDelta(delta))
        return out

    def _close(self) -> list[OutputChunk]:
        tail = self._detok.flush()
        self._state = "closed"
        out: list[OutputChunk] = [ItemDelta(tail)] if tail else []
        out.append(ItemEnded())
        return out

    def finish(self) -> list[OutputChunk]:
        return self._close() if self._state == "open" else []


class CallParsingTextParser:
    """OutputParser for templates that write calls as `<tool_call>` JSON: text becomes a message
    item, each call a function_call item (see chat_template_tools.ToolCallTextParser)."""

    def __init__(self, tokenizer: Any, stop_ids: frozenset[int]) -> None:
        self._detok = IncrementalDetokenizer(tokenizer)
        self._stop = stop_ids
        self._calls = ToolCallTextParser()
        self._closed = False

    def feed(self, token_id: int) -> list[OutputChunk]:
        if self._closed:
            return []
        if token_id in self._stop:
            return self.finish()
        return self._calls.feed(self._detok.push(token_id))

    def finish(self) -> list[OutputChunk]:
        if self._closed:
            return []
        self._closed = True
        return self._calls.feed(self._detok.flush()) + self._calls.finish()


class ChatTemplateFormat(ChatFormat):
    """ChatFormat backed by a local transformers tokenizer with a chat template."""

    name = "chat_template"
    # The code interpreter is the function `code_interpreter.python` (chat_template_server_tools.CODE_TOOL).
    reserved_server_labels = frozenset({CODE_TOOL.partition(".")[0]})

    def __init__(self, model_dir: Path, extra_stop_ids: Sequence[int] = ()) -> None:
        self.model_dir = Path(model_dir)
        self.tokenizer = _load_tokenizer(self.model_dir)
        template = getattr(self.tokenizer, "chat_template", None)
        if not template:
            raise ValueError(f"tokenizer in {self.model_dir} has no chat_template; cannot render conversations")
        source = template if isinstance(template, str) else json.dumps(template)
        # Templates that never mention these render tool turns badly or raise: fall back to text.
        self._structured_tools = "tool_calls" in source
        self._tools_in_template = "tools" in source.replace("tool_calls", "")
        # Qwen-style templates write calls as <tool_call> JSON: parse them, and constrain them.
        self._call_syntax = CALL_OPEN in source
        self._stop = frozenset(self._eos_ids() | {int(i) for i in extra_stop_ids})
        if not self._stop:
            raise ValueError(f"no eos token for the tokenizer in {self.model_dir}: generation could never stop")

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        gen_config = self.model_dir / "generation_config.json"
        if gen_config.is_file():
            eos = json.loads(gen_config.read_text()).get("eos_token_id")
            ids.update(int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None)
        return ids

    def constraint_for(self, request: PromptRequest, plan: DecodingPlan | None = None) -> LogitsConstraint | None:
        """The whole completion constrained by what the plan asks (calls in the template's `<tool_call>`
        syntax, the answer's text.format), or None for free text. Plans this format cannot enforce
        are refused when the request is created (refuse_plan)."""
        if plan is None:
            return None
        tokenizer = self.grammar_tokenizer()
        spec = completion_grammar(plan, tokenizer) if self._call_syntax else plan.final_grammar
        if spec is None:
            return None
        grammar = compile_grammar(spec, tokenizer, max_bytes=1 << 62)  # checked when the request was created
        return CompletionConstraint(GrammarMatcher(tokenizer, grammar, tuple(sorted(self._stop))), self._stop)

    def grammar_tokenizer(self) -> llguidance.LLTokenizer:
        """The llguidance tokenizer of this model's tokenizer.json (built once)."""
        return hf_tokenizer(self.model_dir, min(self._stop))

    def refuse_plan(self, plan: DecodingPlan) -> tuple[str, str] | None:
        """(message, param) when the plan needs what this format cannot enforce: custom tools (no
        call syntax for raw input), and forced or strict calls when the template has no
        `<tool_call>` syntax."""
        for index, call in enumerate(plan.calls):
            if call.custom and call.name != PYTHON_TARGET:  # the code interpreter: see chat_template_server_tools
                return (
                    f"This model uses a chat template: custom tool '{call.name}' needs a Harmony model.",
                    f"tools[{index}]",
                )
        if self._call_syntax:
            spec = completion_grammar(plan, self.grammar_tokenizer())
            if spec is not None:
                try:
                    compile_grammar(spec, self.grammar_tokenizer(), max_bytes=1 << 62)
                except GrammarError as exc:
                    return (f"The tools cannot be constrained for this model: {exc}", "tools")
            return None
        if not plan.final:
            return ("This model's chat template has no tool-call syntax to force a call in.", "tool_choice")
        for index, call in enumerate(plan.calls):
            if call.grammar is not None and call.grammar.strict:
                return (
                    f"This model's chat template has no tool-call syntax for strict tool '{call.name}'.",
                    f"tools[{index}]",
                )
        return None

    def chat_messages(self, request: PromptRequest) -> list[dict[str, Any]]:
        return items_to_chat_messages(
            request, structured_tools=self._structured_tools, tools_in_template=self._tools_in_template
        )

    def render(self, request: PromptRequest) -> list[int]:
        tools = [_hf_tool(t) for t in request.tools] if request.tools and self._tools_in_template else None
        ids = self.tokenizer.apply_chat_template(
            self.chat_messages(request), tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # some versions return a BatchEncoding anyway
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def tool_result_tokens(self, name: str, result: str) -> list[int]:
        """The continuation after the model's call to server tool `name` (ended by the eos token): the
        template's rendering of `result` as a tool message, then the generation prompt."""

        def render_text(items: list[ConversationItem], add_generation_prompt: bool) -> str:
            messages = self.chat_messages(PromptRequest(items=items))
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt
            )
            return str(text)

        text = result_text_after_turn(render_text, str(self.tokenizer.eos_token), name, result)
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]

    def server_tool_result_tokens(self, namespace: str, name: str, text: str) -> list[int]:
        """`tool_result_tokens` of the function the model called: `SERVER_LABEL.NAME`, or CODE_TOOL."""
        return self.tool_result_tokens(CODE_TOOL if namespace == "python" else f"{namespace}.{name}", text)

    def approved_call_prompt(self, request: PromptRequest, prompt_ids: list[int]) -> list[int] | None:
        """The prompt of a run that starts by executing the approved call its items end with: cut right after
        the end-of-turn token that closes that call's assistant turn. None when the items do not end so."""
        eos = self.tokenizer.eos_token_id
        if not ends_with_approved_call(request.items) or eos is None or eos not in prompt_ids:
            return None
        return prompt_ids[: len(prompt_ids) - prompt_ids[::-1].index(eos)]

    def stop_token_ids(self) -> frozenset[int]:
        return self._stop

    def new_parser(self) -> PlainTextParser | CallParsingTextParser:
        if self._call_syntax:
            return CallParsingTextParser(self.tokenizer, self._stop)
        return PlainTextParser(self.tokenizer, self._stop)

    def new_constraint(self) -> LogitsConstraint | None:
        return None

    def token_text(self, token_id: int) -> str:
        return str(self.tokenizer.decode([token_id]))

    def encode_text(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)]

    def count_tokens(self, text: str) -> int:
        return len(self.encode_text(text))
