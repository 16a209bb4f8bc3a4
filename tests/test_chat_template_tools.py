"""Qwen-style `<tool_call>` output: parsing text and calls, and the completion grammar."""

from __future__ import annotations

import json
from typing import Any

import pytest

from service.constraints.plan import constraint_spec, plan_from_spec
from service.prompting.base import ItemDelta, ItemEnded, ItemStarted, OutputChunk
from service.prompting.chat_template_tools import ToolCallTextParser, completion_grammar


def _items(chunks: list[OutputChunk]) -> list[tuple[str, str | None, str]]:
    """(kind, name, text) per item."""
    items: list[tuple[str, str | None, str]] = []
    for chunk in chunks:
        if isinstance(chunk, ItemStarted):
            items.append((chunk.kind, chunk.name, ""))
        elif isinstance(chunk, ItemDelta):
            kind, name, text = items[-1]
            items[-1] = (kind, name, text + chunk.text)
    assert sum(isinstance(c, ItemEnded) for c in chunks) == len(items)
    return items


@pytest.mark.parametrize("split", [1, 3, 7, 1000])
def test_text_and_calls_split_anywhere(split: int) -> None:
    text = 'Let me check.\n<tool_call>{"name": "weather", "arguments": {"city": "paris"}}</tool_call>\n<tool_call>'
    text += '{"name": "time", "arguments": {}}</tool_call>'
    parser = ToolCallTextParser()
    chunks: list[OutputChunk] = []
    for start in range(0, len(text), split):
        chunks += parser.feed(text[start : start + split])
    chunks += parser.finish()
    assert _items(chunks) == [
        ("message", None, "Let me check.\n"),
        ("function_call", "weather", '{"city": "paris"}'),
        ("function_call", "time", "{}"),
    ]


def test_lookalikes_and_cut_calls_stay_text() -> None:
    parser = ToolCallTextParser()
    chunks = parser.feed("a <tool_cal> b <tool_call>not json</tool_call> c <tool_call>{") + parser.finish()
    assert _items(chunks) == [
        ("message", None, "a <tool_cal> b "),
        ("message", None, "<tool_call>not json</tool_call>"),
        ("message", None, " c "),
        ("message", None, "<tool_call>{"),  # a call cut short (max_output_tokens) is kept as text
    ]
    assert _items(ToolCallTextParser().finish()) == [("message", None, "")]  # nothing: one empty message


def test_completion_grammar_per_plan() -> None:
    import llguidance

    from service.prompting.testing_tokenizer import write_tiny_chat_model_tokenizer

    def plan(tools: list[dict[str, Any]], **spec: Any) -> Any:
        base: dict[str, Any] = {"tool_choice": "auto", "text_format": None, "max_tool_calls": None}
        return plan_from_spec(tools, constraint_spec(**{**base, **spec, "reasoning_budget": 0}))

    import tempfile
    from pathlib import Path

    folder = Path(tempfile.mkdtemp())
    write_tiny_chat_model_tokenizer(folder)
    tokenizer = llguidance.LLTokenizer(str(folder / "tokenizer.json"), eos_token=2)
    loose = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    assert completion_grammar(plan([loose]), tokenizer) is None  # free text: nothing to enforce
    strict = {
        **loose,
        "strict": True,
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    }
    forced = completion_grammar(plan([strict], tool_choice="required"), tokenizer)
    assert forced is not None and forced.source.startswith("start: call\n")
    either = completion_grammar(plan([strict]), tokenizer)
    assert either is not None and "start: call | TEXT" in either.source
    fmt = {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": False}
    answer = completion_grammar(plan([loose], text_format=fmt), tokenizer)
    assert answer is not None and json.loads(answer.source) == {"type": "object"}
