"""Test doubles for the engine and chat format (tests only; the server always runs a real model)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from service.engine.base import EngineError, LogitsConstraint, SamplingParams, TokenOutput
from service.prompting.base import ChatFormat, ItemDelta, ItemEnded, ItemStarted, OutputChunk, PromptRequest

STOP = 0


class ScriptedEngine:
    """Every sequence spells `script` one character per step (token = code point), then STOP."""

    model_id = "scripted"
    max_context = 100_000

    def __init__(self, script: str, step_delay: float = 0.0, fail_prefill_on: int | None = None) -> None:
        self.script = script
        self.step_delay = step_delay
        self.sequences: dict[str, tuple[int, SamplingParams]] = {}
        self.steps = 0
        # A prompt holding this token id fails in its first step, as a deferred prefill may.
        self.fail_prefill_on = fail_prefill_on
        self._doomed: set[str] = set()
        self._failed: dict[str, EngineError] = {}

    def add_sequence(
        self,
        seq_id: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        constraint: LogitsConstraint | None = None,
        generated_ids: Sequence[int] = (),
    ) -> None:
        self.sequences[seq_id] = (len(generated_ids), params)
        if self.fail_prefill_on is not None and self.fail_prefill_on in prompt_ids:
            self._doomed.add(seq_id)

    def step(self) -> dict[str, TokenOutput]:
        time.sleep(self.step_delay)
        self.steps += 1
        for seq_id in self._doomed & set(self.sequences):
            del self.sequences[seq_id]
            self._failed[seq_id] = EngineError("prefill failed")
        self._doomed.clear()
        out = {}
        for seq_id, (index, params) in list(self.sequences.items()):
            token = ord(self.script[index]) if index < len(self.script) else STOP
            reason = "stop" if token == STOP else ("length" if index + 1 >= params.max_new_tokens else None)
            out[seq_id] = TokenOutput(token, 0.0, finish_reason=reason)  # type: ignore[arg-type]
            if reason:
                del self.sequences[seq_id]
            else:
                self.sequences[seq_id] = (index + 1, params)
        return out

    def remove_sequence(self, seq_id: str) -> None:
        self.sequences.pop(seq_id, None)
        self._doomed.discard(seq_id)

    def pop_failures(self) -> dict[str, EngineError]:
        failed, self._failed = self._failed, {}
        return failed

    def active_sequence_ids(self) -> list[str]:
        return list(self.sequences)

    def warm_prefix(self, tokens: Sequence[int]) -> None:
        pass  # no prefix cache to ready

    def warm(self, max_tokens: int) -> bool:
        return False


class CharParser:
    def __init__(self) -> None:
        self.open = False

    def feed(self, token_id: int) -> list[OutputChunk]:
        if token_id == STOP:
            return self.finish()
        chunks: list[OutputChunk] = [] if self.open else [ItemStarted("message")]
        self.open = True
        return [*chunks, ItemDelta(chr(token_id))]

    def finish(self) -> list[OutputChunk]:
        was_open, self.open = self.open, False
        return [ItemEnded()] if was_open else []


class CharFormat(ChatFormat):
    name = "chars"

    def render(self, request: PromptRequest) -> list[int]:
        return [ord(c) for item in request.items for part in item.get("content", []) for c in part.get("text", "")]

    def stop_token_ids(self) -> frozenset[int]:
        return frozenset({STOP})

    def new_parser(self) -> CharParser:
        return CharParser()

    def new_constraint(self) -> None:
        return None

    def encode_text(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def count_tokens(self, text: str) -> int:
        return len(text)

    def token_text(self, token_id: int) -> str:
        return chr(token_id) if token_id != STOP else ""
