"""The engine contract: a table of active sequences stepped together.

The run supervisor owns the asyncio side; an engine is synchronous and is
stepped from a worker thread (ONNX Runtime releases the GIL). One `step()`
advances *every* active sequence by one token, which is the seam where
continuous batching lives and where the supervisor group-commits events.
Admitting a sequence is cheap: its prompt is prefilled by the following
steps, in bounded chunks between decode runs, so running streams never wait
for a whole prompt; a sequence yields its first token once its prefill is done.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

# How long one sequence's grammar mask may take before that sequence fails (ordinary masks take well under 10 ms).
# The others never wait this long (a late mask sits its steps out), so it is generous: loaded machines.
# SERVICE_MASK_DEADLINE_SECONDS sets it for the server.
DEFAULT_MASK_DEADLINE_S = 2.0

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one sequence.

    Randomness is a pure function of (seed, token index): a run resumed after a
    crash from its logged tokens draws exactly what an uninterrupted run draws.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int = 0
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    top_logprobs: int = 0  # 0 = off
    # The sampled token's logprob too (a pass over the vocabulary more for greedy, a float64 sum more at
    # temperature 1); the server asks for it only when the request does. top_logprobs implies it.
    logprobs: bool = True
    # OpenAI semantics, over the tokens generated so far in this response (replayed ones included):
    # logits[t] -= presence_penalty * (count[t] > 0) + frequency_penalty * count[t]
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0


@dataclass(frozen=True)
class TokenBitmask:
    """Allowed next tokens as packed bits (llguidance's layout): bit i of `words[j]` allows token 32*j+i.

    Tokens past the end of `words` are not allowed."""

    words: np.ndarray  # uint32


AllowedTokens = np.ndarray | TokenBitmask


class LogitsConstraint(Protocol):
    """Per-sequence grammar hook (e.g. the Harmony header, a JSON schema). Stateful; fed every sampled
    token. Its state must be a pure function of the tokens accepted so far (a resumed run rebuilds it
    by replaying them), and allowed_token_ids() must not change the state: the engine may call it
    from a worker thread while the model computes, and again before sampling. A mask that is late (past the
    engine's deadline) fails its sequence alone (pop_failures); so does a constraint whose optional
    `failure() -> str | None` method reports a reason (a grammar out of llguidance's per-step fuel)."""

    def allowed_token_ids(self) -> AllowedTokens | None:
        """Token ids the next token may be (an id array or a packed bitmask), or None for no restriction."""
        ...

    def accept(self, token_id: int) -> None:
        """Advance the grammar by a token that was sampled (or replayed on resume)."""
        ...


@dataclass(frozen=True)
class TokenOutput:
    """One sampled token of one sequence."""

    token_id: int
    logprob: float | None  # None unless SamplingParams.logprobs (or top_logprobs)
    top_logprobs: tuple[tuple[int, float], ...] = ()
    # Set on the sequence's last token; the engine drops the sequence itself then.
    finish_reason: FinishReason | None = None


class EngineError(Exception):
    """A sequence could not be admitted or stepped (e.g. prompt longer than the context)."""


class Engine(Protocol):
    model_id: str
    max_context: int  # prompt + generated tokens one sequence may hold

    def add_sequence(
        self,
        seq_id: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        constraint: LogitsConstraint | None = None,
        generated_ids: Sequence[int] = (),
    ) -> None:
        """Admit a sequence (quick: validation only; EngineError if it cannot be, e.g. too long for the
        context). Its prefill is done by the next steps. `generated_ids` are tokens already sampled
        (resume after a crash): they are prefilled after the prompt and the next draw uses token index
        len(generated_ids). The caller has already fed them to `constraint`."""
        ...

    def step(self) -> dict[str, TokenOutput]:
        """Do a bounded share of the pending prefill work, then advance every prefilled sequence by one
        token (blocking). Sequences still prefilling yield nothing; finished ones are dropped. A sequence
        whose prefill failed is dropped too and reported by pop_failures(), never raised from here."""
        ...

    def pop_failures(self) -> dict[str, EngineError]:
        """Sequences dropped since the last call because their prefill failed, or their constraint did (a late
        mask, a grammar out of fuel); ask after each step."""
        ...

    def remove_sequence(self, seq_id: str) -> None:
        """Forget a sequence (cancelled or abandoned), prefilling or not; unknown ids are ignored."""
        ...

    def active_sequence_ids(self) -> list[str]:
        """Every admitted sequence not yet finished or removed, those still prefilling included."""
        ...

    def warm_prefix(self, tokens: Sequence[int]) -> None:
        """Tokens a sequence will likely start with soon (the next turn of a conversation): an engine with a
        prefix cache prefills them into it (warm); others ignore them."""
        ...

    def warm(self, max_tokens: int) -> bool:
        """Work the engine may do beside its sequences (blocking, about `max_tokens` tokens of prefill at most),
        such as prefilling warm_prefix() prompts into its cache, never while a sequence is prefilling; True
        while some is left. It never changes what any sequence samples."""
        ...
