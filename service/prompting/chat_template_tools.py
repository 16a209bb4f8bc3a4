"""Tool calls and constrained output for chat-template models whose template writes calls as
Qwen's `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

- `ToolCallTextParser`: completion text -> a message item for the text and a function_call item
  for each `<tool_call>` block (text that merely looks like one stays text).
- `completion_grammar`: the Lark grammar a DecodingPlan asks of the whole completion: only calls
  (a forced tool_choice), a call or an answer (strict functions), the answer's JSON (text.format).
- `CompletionConstraint`: that grammar's matcher over the whole completion; once complete only a
  stop token may follow.
"""

from __future__ import annotations

import json
from typing import Any

import llguidance

from service.constraints.compiler import GrammarError, GrammarSpec, compile_grammar
from service.constraints.matcher import GrammarMatcher
from service.constraints.plan import PYTHON_TARGET, CallTarget, DecodingPlan
from service.engine.base import TokenBitmask
from service.prompting.base import ItemDelta, ItemEnded, ItemStarted, OutputChunk
from service.prompting.chat_template_server_tools import code_call_body, json_call_target

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_JSON_OPTIONS = {"whitespace_flexible": False}
# An answer that is not a call: any text that does not start a call.
_TEXT_RULE = "TEXT: /[^<][\\s\\S]*/"


class ToolCallTextParser:
    """Text deltas in (already detokenized), output chunks out; items never interleave."""

    def __init__(self) -> None:
        self._pending = ""  # text not yet emitted (may hold the start of a marker)
        self._in_call = False
        self._message_open = False
        self._held_space = ""  # whitespace that only becomes text if more text follows
        self._items = 0  # items started so far

    def feed(self, text: str) -> list[OutputChunk]:
        self._pending += text
        out: list[OutputChunk] = []
        while True:
            if self._in_call:
                end = self._pending.find(CALL_CLOSE)
                if end < 0:
                    return out
                out += self._call(self._pending[:end])
                self._pending, self._in_call = self._pending[end + len(CALL_CLOSE) :], False
                continue
            start = self._pending.find(CALL_OPEN)
            if start >= 0:
                out += self._text(self._pending[:start])
                out += self._close_message()
                self._held_space = ""
                self._pending, self._in_call = self._pending[start + len(CALL_OPEN) :], True
                continue
            keep = _marker_prefix_length(self._pending)
            out += self._text(self._pending[: len(self._pending) - keep])
            self._pending = self._pending[len(self._pending) - keep :]
            return out

    def finish(self) -> list[OutputChunk]:
        out: list[OutputChunk] = []
        if self._in_call:  # cut short inside a call: keep what was written, as text
            self._pending, self._in_call = CALL_OPEN + self._pending, False
        out += self._text(self._pending)
        self._pending = ""
        if not self._items:  # nothing but whitespace (or nothing): still one message, as before calls existed
            out += [ItemStarted("message"), *([ItemDelta(self._held_space)] if self._held_space else [])]
            self._message_open, self._held_space = True, ""
        return out + self._close_message()

    def _text(self, text: str) -> list[OutputChunk]:
        if not text:
            return []
        if not self._message_open and not (self._held_space + text).strip():
            self._held_space += text
            return []
        out: list[OutputChunk] = []
        if not self._message_open:
            self._message_open = True
            self._items += 1
            out.append(ItemStarted("message"))
            text, self._held_space = self._held_space + text, ""
        out.append(ItemDelta(text))
        return out

    def _close_message(self) -> list[OutputChunk]:
        if not self._message_open:
            return []
        self._message_open = False
        return [ItemEnded()]

    def _call(self, body: str) -> list[OutputChunk]:
        try:
            call = json.loads(body)
            name, arguments = call["name"], call.get("arguments", {})
            if not isinstance(name, str):
                raise TypeError(name)
        except (ValueError, TypeError, KeyError):
            return self._text(CALL_OPEN + body + CALL_CLOSE) + self._close_message()
        text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        code = code_call_body(name, arguments)
        if code is not None:  # the code interpreter: its body is the code, as on Harmony
            name, text = code
        self._items += 1
        return [ItemStarted("function_call", name=name), ItemDelta(text), ItemEnded()]


def _marker_prefix_length(text: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of CALL_OPEN."""
    for length in range(min(len(text), len(CALL_OPEN) - 1), 0, -1):
        if CALL_OPEN.startswith(text[-length:]):
            return length
    return 0


def _rebase_refs(node: Any, base: str) -> Any:
    """Local `$ref`s ("#/...") of a schema that is moved to `base` inside a larger document."""
    if isinstance(node, dict):
        return {
            key: (
                base + value[1:]
                if key == "$ref" and isinstance(value, str) and value.startswith("#")
                else _rebase_refs(value, base)
            )
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_rebase_refs(item, base) for item in node]
    return node


def _arguments_schema(target: CallTarget, tokenizer: llguidance.LLTokenizer, base: str) -> dict[str, Any]:
    assert target.grammar is not None and target.grammar.kind == "json_schema"
    schema: dict[str, Any] = json.loads(target.grammar.source)
    if not target.grammar.strict:
        try:
            compile_grammar(target.grammar, tokenizer, max_bytes=1 << 62)
        except GrammarError:
            return {"type": "object"}
    rebased: dict[str, Any] = _rebase_refs(schema, base)
    return rebased


def completion_grammar(plan: DecodingPlan, tokenizer: llguidance.LLTokenizer) -> GrammarSpec | None:
    """What the whole completion must match under `plan`, or None when it is free text."""
    calls = [json_call_target(c) for c in plan.calls if not c.custom or c.name == PYTHON_TARGET]
    strict = any(c.grammar is not None and c.grammar.strict for c in calls)
    # A server-side tool (`LABEL.NAME`: function names have no dot) is always constrained, as on Harmony:
    # its call must be well-formed to be executed, and ends the completion.
    server = any("." in c.name for c in calls)
    if plan.final and not strict and not server:
        return plan.final_grammar  # None (free text) or the answer's JSON schema
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": c.name},
                "arguments": _arguments_schema(c, tokenizer, f"#/anyOf/{i}/properties/arguments"),
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for i, c in enumerate(calls)
    ]
    call_schema = {"anyOf": options, "x-guidance": {**_JSON_OPTIONS, "lenient": not strict}}
    rules = [f'call: "{CALL_OPEN}" %json {json.dumps(call_schema, sort_keys=True)} "{CALL_CLOSE}"']
    if not plan.final:
        start = "start: call"
    elif plan.final_grammar is not None:
        answer = json.loads(plan.final_grammar.source)
        options_json = {**answer, "x-guidance": {**_JSON_OPTIONS, "lenient": not plan.final_grammar.strict}}
        start = f"start: call | %json {json.dumps(options_json, sort_keys=True)}"
    else:
        start = "start: call | TEXT"
        rules.append(_TEXT_RULE)
    return GrammarSpec("lark", "\n".join([start, *rules]))


class CompletionConstraint:
    """LogitsConstraint over a whole chat-template completion: the matcher's bitmask at every step;
    once the grammar is complete only a stop token may follow. A pure function of the tokens fed."""

    def __init__(self, matcher: GrammarMatcher, stop_ids: frozenset[int]) -> None:
        self._matcher = matcher
        self._stop = stop_ids
        self._done = False

    def allowed_token_ids(self) -> TokenBitmask | None:
        return None if self._done else TokenBitmask(self._matcher.bitmask())

    def failure(self) -> str | None:
        """The grammar ran out of llguidance's per-step fuel (the engine fails the run)."""
        return self._matcher.exhausted

    def accept(self, token_id: int) -> None:
        if token_id in self._stop:
            self._done = True
        elif not self._done:
            self._matcher.accept(token_id)
