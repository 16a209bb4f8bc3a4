"""What a training sample is (a request, the completion the model should write, its kind) and the helpers the
generators share (service/training/corpus.py, chat_turns.py, drills.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from service.prompting.base import ConversationItem, PromptRequest

Kind = Literal["answer", "call", "after_tool"]
Effort = Literal["low", "medium", "high"]
EFFORTS: tuple[Effort, ...] = ("low", "medium", "high")


@dataclass(frozen=True)
class Step:
    """One assistant message of a completion: channel "analysis", "final" or "call"."""

    channel: str
    text: str
    recipient: str | None = None  # the function name of a call


@dataclass(frozen=True)
class Sample:
    request: PromptRequest
    completion: tuple[Step, ...]
    kind: Kind
    tool: str | None = None  # the expected call's function name (kind "call")
    argument: tuple[str, str] | None = None  # (parameter, value copied from the user turn)
    salient: str | None = None  # the tool output's value the answer must contain (kind "after_tool")


def pick(rng: np.random.Generator, seq: tuple[str, ...] | list[str]) -> str:
    return seq[int(rng.integers(len(seq)))]


def user_item(text: str) -> ConversationItem:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def assistant_item(text: str) -> ConversationItem:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def reasoning_for(sentences: list[str], effort: Effort) -> str:
    """Low effort: one sentence; medium: two; high: three (effort-dependent length)."""
    return " ".join(sentences[: {"low": 1, "medium": 2, "high": 3}[effort]])
