"""Prefix reuse and warming (engine/prefix_cache.py holds the rows): an admitted prompt starts from the longest
cached prefix of it, or from a live sequence's prefilled rows; prompts expected soon (a conversation's next
turn, warm_prefix) are prefilled into the cache by warm(), idle or beside decoding sequences, by one warming
sequence that a newcomer whose prompt starts with its rows takes over, slot and all. Only rows computed by
runs of 2+ tokens are reused, and a reuse leaves 2+ tokens to prefill, so no sampled token changes."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from service.engine.base import EngineError, SamplingParams
from service.engine.core import EngineSequence
from service.engine.prefill_schedule import PrefillSchedule
from service.engine.prefix_cache import common_prefix_length

# Prompts warm_prefix() keeps for warm() to prefill (the most recent ones).
WARM_QUEUE = 4
# A prompt to warm that starts with all but this many of the warming sequence's rows retargets it (see warm).
_RETARGET_SLACK = 8


class PrefixWarming(PrefillSchedule):
    """Prefix-cache reuse at admission, and warming the cache with prompts expected soon."""

    max_context: int
    # Prompts expected soon (warm_prefix), prefilled into the prefix cache by warm().
    _to_warm: deque[list[int]]

    def warm_prefix(self, tokens: Sequence[int]) -> None:
        """Tokens a sequence will likely start with soon: the next turn of a conversation, as that turn will
        render it. warm() prefills them into the prefix cache (no-op without one)."""
        if self.prefix_cache is not None and 2 <= len(tokens) < self.max_context:
            self._to_warm.append([int(t) for t in tokens])

    def warm(self, max_tokens: int) -> bool:
        """Prefill up to about `max_tokens` of the prompts given to warm_prefix() into the prefix cache; returns
        whether any such work is left. Idle, or beside sequences that are decoding, never while one is
        prefilling: a newcomer's prompt comes first, and its add_sequence ends the warming (what is prefilled
        so far is cached, the rest dropped). Warming is prefill runs of its own, and only prefill rows are ever
        cached, so no sampled token changes.

        One sequence does the warming. A prompt that extends what it holds (the same conversation's next turn,
        rendered again as its output grew) retargets it: only the new tokens are prefilled, nothing is copied.
        Another prompt waits until the current one is done, which then goes to the cache (whose longest cached
        prefix, or a live sequence's prefilled rows, the new one starts from). Done and idle, it is cached too."""
        cache = self.prefix_cache
        if cache is None:
            return False
        if self.prefilling_sequence_ids():
            return self._warm_work_left()
        spent = 0
        while spent < max_tokens:
            seq = self._warming
            if self._to_warm and (seq is None or seq.ready or self._extends(seq, self._to_warm[0])):
                self._warm_towards(self._to_warm.popleft())
                continue
            if seq is None or seq.ready:
                break
            n = self._next_run(seq, max_tokens - spent)
            try:
                self._prefill_run(seq, n)
            except Exception as exc:
                self._end_warming()  # keeps what was prefilled before; the queue is dropped
                raise EngineError(f"warming the prefix cache: {exc}") from exc
            spent += n
            cache.note_warmed(n)
        if not self._seqs and not self._warm_work_left():
            self._end_warming()  # idle with nothing left: cache it, and give the KV pool's pages back
        return self._warm_work_left()

    def _reuse_prefix(self, seq: EngineSequence, ids: list[int], *, count_hit: bool = True) -> int:
        """Copy the longest cached prefix of the prompt `ids` into the sequence's slot, leaving at least
        its last two tokens to prefill (one alone would take the decode kernels and differ in the last
        bits from a cold prefill; _next_run never leaves one alone either); returns how many tokens the
        copy covers."""
        if self.prefix_cache is None:
            return 0
        common, entry = self.prefix_cache.match(ids)
        n = min(common, len(ids) - 2)
        if entry is None or n <= 0:
            return 0
        self._take_rows(seq, ids, n, entry.rows)
        if count_hit:  # a run's reuse (what the metrics report), not warming's
            self.prefix_cache.note_hit(n)
        return n

    def _reuse_live_prefix(self, seq: EngineSequence, ids: list[int]) -> None:
        """Where a sequence still running prefilled more of `ids` than the cache held (a conversation's next turn
        warmed while its current turn decodes: that turn's prompt is in its slot, not yet in the cache), copy
        those rows from its slot instead of prefilling them again (leaving 2+ tokens, as _reuse_prefix does)."""
        best, source = seq.length, None
        for other in self._seqs.values():
            n = min(other.prefilled, len(ids) - 2)
            if n > best and other.slot >= 0:
                common = common_prefix_length(other.tokens[:n], ids)
                if common > best:
                    best, source = common, other
        if source is not None:
            self._take_rows(seq, ids, best, [arr[source.slot] for arr in self._pool.arrays])

    def _take_rows(self, seq: EngineSequence, ids: list[int], n: int, rows: list[np.ndarray]) -> None:
        """Copy the first `n` rows of `rows` (one [kv_heads, tokens, head_dim] array per past tensor) into the
        sequence's slot: it then holds `ids[:n]`, as if it had prefilled them."""
        for arr, source in zip(self._pool.arrays, rows, strict=True):
            arr[seq.slot, :, :n] = source[:, :n]
        seq.length = seq.prefilled = n
        seq.tokens = list(ids[:n])

    def _warm_work_left(self) -> bool:
        return bool(self._to_warm) or (self._warming is not None and not self._warming.ready)

    def _rows_kept_for(self, seq: EngineSequence, ids: list[int]) -> int:
        """How many leading rows of the warming sequence the prompt `ids` starts with."""
        return common_prefix_length(seq.tokens[: seq.prefilled], ids)

    def _extends(self, seq: EngineSequence, ids: list[int]) -> bool:
        """Whether `ids` continues what the warming sequence holds (all its rows but a few: an earlier render's
        guess at its text's end may differ in the last tokens)."""
        kept = self._rows_kept_for(seq, ids)
        return kept > 0 and seq.prefilled - kept <= _RETARGET_SLACK

    def _warm_towards(self, ids: list[int]) -> None:
        """Have the warming sequence prefill `ids`: retargeted where `ids` extends it, else a new one (the old one
        cached); nothing changes where it holds all of `ids` already (an older render)."""
        seq = self._warming
        if seq is not None:
            kept = self._rows_kept_for(seq, ids)
            if kept >= len(ids):
                return
            if kept > 0 and seq.prefilled - kept <= _RETARGET_SLACK:
                keep = min(kept, len(ids) - 2)  # as a reuse does: a 1-token run would take the decode kernels
                seq.length = seq.prefilled = keep  # rows past it are stale, bounded by seqlens and overwritten
                del seq.tokens[keep:]
                seq.pending, seq.prompt_len = ids, len(ids)
                return
            self._warming = None
            self._release(seq)  # caches its rows
        seq = self._warming = EngineSequence(SamplingParams(max_new_tokens=1), None, [], 0, 0, np.empty(0, np.float32))
        seq.pending, seq.prompt_len = ids, len(ids)
        self._acquire(seq)
        self._reuse_prefix(seq, ids, count_hit=False)
        self._reuse_live_prefix(seq, ids)

    def _adopt_warming(self, seq: EngineSequence, ids: list[int]) -> bool:
        """Give `seq` the warming sequence's slot when the prompt `ids` starts with more of its rows than the prefix
        cache holds (the conversation's next turn, come while or after it was warmed): its rows stay where they
        are, instead of being copied into the cache and from there into a new slot (two copies of the whole
        conversation's keys and values, tens of ms at a few thousand tokens). As a reuse does, it leaves the
        last 2+ tokens to prefill."""
        warming, cache = self._warming, self.prefix_cache
        if warming is None or cache is None:
            return False
        kept = min(self._rows_kept_for(warming, ids), len(ids) - 2)
        if kept <= 0 or kept < cache.match(ids)[0]:
            return False
        self._to_warm.clear()
        self._warming = None
        seq.slot, self._slots[warming.slot] = warming.slot, seq
        seq.length = seq.prefilled = kept  # rows past it are stale, bounded by seqlens and overwritten
        seq.tokens = warming.tokens[:kept]
        cache.note_hit(kept)
        return True

    def _end_warming(self) -> None:
        self._to_warm.clear()
        if self._warming is not None:
            seq, self._warming = self._warming, None
            self._release(seq)  # caches the rows prefilled so far
