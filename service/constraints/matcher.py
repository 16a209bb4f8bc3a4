"""A per-run grammar matcher: fed every sampled (or replayed) token, it says which may come next.

Its state is never stored: a resumed run rebuilds it by feeding the logged tokens again (about
1 ms per 1,000 tokens), so it is a pure function of the token sequence. llguidance matchers do
not raise on a bad token or a resource limit: they enter an error state, which `error` reports.
A resource limit (llguidance's per-step fuel, PARSER_LIMITS) hit while computing a mask, or while
consuming a token that mask allowed, is also reported by `exhausted`: the engine fails such a run
(it is the grammar's cost, not the model's output, that ended it).
"""

from __future__ import annotations

import llguidance
import numpy as np

from service.constraints.compiler import PARSER_LIMITS, CompiledGrammar, is_limit_error


class GrammarMatcher:
    """Constrains one message body. When the grammar is complete, the tokenizer's end token
    (bit `eos`) is replaced by `terminators`, the tokens that end this body in the chat format."""

    def __init__(
        self, tokenizer: llguidance.LLTokenizer, grammar: CompiledGrammar, terminators: tuple[int, ...]
    ) -> None:
        self._matcher = llguidance.LLMatcher(tokenizer, grammar.grammar, log_level=0, limits=PARSER_LIMITS)
        self._eos = tokenizer.eos_token
        self._terminators = terminators
        self._mask: np.ndarray | None = None
        self.error: str | None = self._matcher.get_error() if self._matcher.is_error() else None
        self.exhausted: str | None = None  # a resource limit's message (see the module's docstring)

    def accept(self, token_id: int) -> bool:
        """Feed one body token; False when the grammar does not allow it (the matcher is then in error)."""
        mask, self._mask = self._mask, None
        if self.error is not None:
            return False
        if not self._matcher.consume_token(token_id) or self._matcher.is_error():
            self.error = self._matcher.get_error() or f"token {token_id} is not allowed by the grammar"
            if mask is not None and _allows(mask, token_id) and is_limit_error(self.error):
                self.exhausted = self.error
            return False
        return True

    def bitmask(self) -> np.ndarray:
        """Packed allowed-token bits (uint32 words, bit i of word j = token 32*j+i); memoized per state."""
        if self._mask is None:
            words = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint32).copy()
            if self._matcher.is_error():
                if self.error is None:
                    self.error = self._matcher.get_error()
                    if is_limit_error(self.error):
                        self.exhausted = self.error
                words[:] = 0
            eos_word, eos_bit = divmod(self._eos, 32)
            complete = bool(words[eos_word] >> np.uint32(eos_bit) & np.uint32(1))
            words[eos_word] &= ~np.uint32(1 << eos_bit)
            if complete or self.error is not None or not words.any():  # a dead end ends the body too
                for token in self._terminators:
                    word, bit = divmod(token, 32)
                    words[word] |= np.uint32(1 << bit)
            words.setflags(write=False)
            self._mask = words
        return self._mask


def _allows(words: np.ndarray, token_id: int) -> bool:
    word, bit = divmod(token_id, 32)
    return word < len(words) and bool(words[word] >> np.uint32(bit) & np.uint32(1))
