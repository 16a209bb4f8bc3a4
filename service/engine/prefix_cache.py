"""A prefix cache: the KV rows of recently finished sequences, keyed by the tokens they hold.

The next turn of a conversation (or of a tool loop) renders a prompt that starts with the previous
turn's prompt and output; `match` finds the longest cached prefix of a new sequence's tokens, so the
engine copies those rows into the sequence's slot and prefills only the rest. Bounded in bytes,
evicting the least recently used entry. Only valid where a token's KV rows do not depend on how its
neighbours were batched or chunked (the shared-buffer MatMulNBits graphs: see onnx_engine.py), which
is what tests/test_prefix_cache.py checks token for token.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CachedPrefix:
    tokens: np.ndarray  # int64 ids whose keys and values `rows` hold, in order
    rows: list[np.ndarray]  # one [kv_heads, len(tokens), head_dim] array per past tensor

    @property
    def nbytes(self) -> int:
        return sum(row.nbytes for row in self.rows) + self.tokens.nbytes


def common_prefix_length(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(differ[0]) if len(differ) else n


class PrefixCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[int, CachedPrefix] = OrderedDict()
        self._next_key = 0
        self.hits = 0
        self.reused_tokens = 0
        self.warmed_tokens = 0  # prefilled for a next turn before it came (OnnxEngine.warm)

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, tokens: Sequence[int], rows: list[np.ndarray]) -> None:
        """Keep `rows` (copies the caller no longer writes) for `tokens`; entries that are a prefix of
        them are dropped (the new one serves every lookup they would)."""
        entry = CachedPrefix(np.asarray(tokens, dtype=np.int64), rows)
        if not len(entry.tokens) or entry.nbytes > self.max_bytes:
            return
        for key, old in list(self._entries.items()):
            if len(old.tokens) <= len(entry.tokens) and np.array_equal(old.tokens, entry.tokens[: len(old.tokens)]):
                self._drop(key)
        while self.bytes + entry.nbytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
        self._entries[self._next_key] = entry
        self._next_key += 1
        self.bytes += entry.nbytes

    def match(self, tokens: Sequence[int]) -> tuple[int, CachedPrefix | None]:
        """The longest cached prefix of `tokens`: (its length, the entry holding it), or (0, None)."""
        ids = np.asarray(tokens, dtype=np.int64)
        best, best_key = 0, -1
        for key, entry in self._entries.items():
            common = common_prefix_length(ids, entry.tokens)
            if common > best:
                best, best_key = common, key
        if best_key < 0:
            return 0, None
        self._entries.move_to_end(best_key)
        return best, self._entries[best_key]

    def note_hit(self, reused: int) -> None:
        self.hits += 1
        self.reused_tokens += reused

    def note_warmed(self, tokens: int) -> None:
        self.warmed_tokens += tokens

    def _drop(self, key: int) -> None:
        self.bytes -= self._entries.pop(key).nbytes
