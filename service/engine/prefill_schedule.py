"""Chunked prefill: add_sequence only validates and registers a sequence; its prompt (and, on resume, its
generated tokens) is prefilled inside step(), first come first served, under a per-step token budget
(`prefill_tokens`, SERVICE_PREFILL_CHUNK_TOKENS), before the step samples and decodes the sequences that
are ready. So a long prompt arriving costs each running stream at most a budget's worth of prefill per
token instead of the whole prompt, and a sequence yields its first token from the step its prefill
ends in. With SERVICE_PREFILL_STALL_RATIO set (off by default), while any sequence decodes the budget is
also one in time (engine/prefill_pacer.py: about that many decode steps of prefill, as measured).
Chunk boundaries never change a sampled bit: on shared-buffer graphs without sliding windows any run
of 2+ tokens gives each row what any other such run gives it (a 1-token run takes the decode kernels),
so the prompt is cut at the budget, never leaving one token alone; elsewhere (standard layout: dynamic
int8 quantizes activations per call; sliding-window caches) the prompt goes in the same fixed chunks as
always. Generated tokens are replayed one per call, as they were decoded.
Prefilling sequences hold slots too; step() swaps slots so that the ready ones are 0..k-1 before it
decodes them as one batch."""

from __future__ import annotations

import time

from service.engine.base import EngineError
from service.engine.core import EngineSequence
from service.engine.masks import Masks
from service.engine.prefill_pacer import PrefillPacer

PREFILL_LOGITS_BUDGET = 1 << 25  # floats of logits one prefill chunk may produce (full-logits graphs)
# What one replayed token (a 1-token run) costs of the prefill budget: a run reads all the weights
# whatever its length, so on CPU it costs about what a run of a few dozen prompt tokens costs.
_REPLAY_COST = 16


class PrefillSchedule(Masks):
    """Which pending prompt tokens a step prefills, in which runs, under its budget."""

    _prefill_chunk: int  # the fixed chunk of a cold prefill (see _next_run)
    prefill_tokens: int
    prefill_pacer: PrefillPacer
    _cut_anywhere: bool

    def prefilling_sequence_ids(self) -> list[str]:
        """Active sequences whose prefill is not done yet (they yield no token until it is)."""
        return [seq_id for seq_id, seq in self._seqs.items() if not seq.ready]

    def _prefill_some(self) -> None:
        """Spend up to one step's prefill budget on the sequences still prefilling, oldest first. A
        sequence whose prefill raises is dropped and reported by pop_failures(); the others go on."""
        if all(seq.ready for seq in self._seqs.values()):
            return
        decoding = any(seq.ready for seq in self._seqs.values())
        budget = self.prefill_pacer.budget(self.prefill_tokens, decoding=decoding)
        spent = 0
        for seq_id, seq in list(self._seqs.items()):
            while not seq.ready and spent < budget:
                n = self._next_run(seq, budget - spent)
                if spent > 0 and n > budget - spent:
                    return  # a fixed chunk larger than what is left of the budget: next step
                try:
                    self._prefill_run(seq, n)
                except Exception as exc:
                    del self._seqs[seq_id]
                    self._release(seq)
                    self._failed[seq_id] = exc if isinstance(exc, EngineError) else EngineError(f"prefill: {exc}")
                    break
                spent += n if n > 1 else _REPLAY_COST
            if seq_id in self._seqs and seq.ready:
                seq.pending = []  # done: `length` keeps counting from here
            if spent >= budget:
                return

    def _prefill_run(self, seq: EngineSequence, n: int) -> None:
        """The next `n` of the sequence's pending tokens, in one run (timed for the pacer)."""
        started = time.perf_counter()
        self._forward(seq, seq.pending[seq.length : seq.length + n])
        self.prefill_pacer.observe_prefill(n, time.perf_counter() - started)

    def _next_run(self, seq: EngineSequence, room: int) -> int:
        """How many of the sequence's pending tokens its next prefill run takes."""
        position = seq.length
        if position >= seq.prompt_len:
            return 1  # a replayed generated token: one per run, as it was decoded
        left = seq.prompt_len - position
        if not self._cut_anywhere:
            # The fixed chunk grid of a cold prefill: only the same calls reproduce the same logits here.
            return min(seq.prompt_len, (position // self._prefill_chunk + 1) * self._prefill_chunk) - position
        n = min(left, max(room, 2), self._prefill_chunk)
        if left - n == 1:  # never leave one prompt token alone: a 1-token run takes the decode kernels
            n = n - 1 if n > 2 else n + 1
        return n
