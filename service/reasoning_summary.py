"""Reasoning summaries (`reasoning.summary`): a deterministic rule over the model's own reasoning text.

This server has no second model to summarise with, so a summary is an extract: the reasoning's first
sentences, whitespace folded, cut at a word boundary. It is a pure function of the reasoning text and the
requested level, so a replayed or resumed run regenerates the same summary events byte for byte.

| level | what the summary holds |
| --- | --- |
| `concise` | the first sentence, at most 200 characters |
| `detailed`, `auto` | the first three sentences, at most 600 characters (`auto`: the most detailed level) |
"""

from __future__ import annotations

import re
from typing import Any

# (sentences, characters) kept for each level.
_LEVELS: dict[str, tuple[int, int]] = {"concise": (1, 200), "detailed": (3, 600), "auto": (3, 600)}
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_ELLIPSIS = "…"


def summary_level(reasoning: dict[str, Any] | None) -> str | None:
    """The level a Response's `reasoning` asks for (`summary`, else the deprecated `generate_summary`)."""
    if not reasoning:
        return None
    level = reasoning.get("summary") or reasoning.get("generate_summary")
    return level if level in _LEVELS else None


def summarize(text: str, level: str) -> str:
    """The summary of reasoning `text` at `level` ("" when there is nothing to summarise)."""
    sentences_kept, limit = _LEVELS[level]
    folded = " ".join(text.split())
    if not folded:
        return ""
    sentences = _SENTENCE_END.split(folded)
    summary = " ".join(sentences[:sentences_kept])
    if len(summary) <= limit:
        return summary
    cut = summary[: limit - len(_ELLIPSIS)]
    space = cut.rfind(" ")
    if space > limit // 2:  # a word boundary not too far back
        cut = cut[:space]
    return cut.rstrip() + _ELLIPSIS
