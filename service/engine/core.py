"""What the parts of the ONNX Runtime engine share: its sequences, the KV slots they hold, the session and the
graph's layout. The engine is built in layers, one module each, each a subclass of the one below it (core,
run_binding, masks, prefill_schedule, prefix_warming, onnx_engine), so a part calls only what lies below it;
OnnxEngine.__init__ (engine/onnx_engine.py) opens the model and sets the state the layers declare.

This layer keeps the slot table: on shared-buffer graphs `_slots[i].slot == i` for the active sequences (dense,
so a batch over slots 0..n-1 is one tensor of the pool, engine/kv_pool.py); a released slot's prefilled rows
go to the prefix cache. With the standard layout each sequence's cache is its own ORT-owned OrtValues."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnxruntime as ort

from service.engine.base import EngineError, LogitsConstraint, SamplingParams
from service.engine.kv_pool import SlotPool
from service.engine.layout import GraphLayout
from service.engine.prefix_cache import PrefixCache


@dataclass(frozen=True)
class MaskJob:
    """A sequence's next grammar mask, computing in a mask thread (engine/masks.py)."""

    future: Future[Any]
    submitted: float  # time.monotonic()
    pool: ThreadPoolExecutor


@dataclass
class EngineSequence:
    """An admitted sequence (or the one warming the prefix cache): its KV cache, next logits, what it has to prefill."""

    params: SamplingParams
    constraint: LogitsConstraint | None
    past: list[ort.OrtValue]  # standard layout only
    length: int  # tokens in the KV cache
    generated: int  # tokens sampled so far, including those replayed on resume
    logits: np.ndarray  # next-token logits, waiting for the next step
    slot: int = -1  # shared-buffer layout: the sequence's row in the KV pool
    counts: dict[int, int] = field(default_factory=dict)  # generated token id -> times (penalties)
    tokens: list[int] = field(default_factory=list)  # the ids in the KV cache (prefix cache key)
    # Leading cache rows computed by runs of 2+ tokens (prefill): those equal, bit for bit, what any other
    # prefill of the same tokens computes; a 1-token run (decode) takes another kernel path and may not.
    prefilled: int = 0
    # Still to prefill: the prompt, then the replayed generated tokens, from position `length` on.
    pending: list[int] = field(default_factory=list)
    # The next mask, computing in a mask thread, until the step that samples it.
    mask_job: MaskJob | None = None
    held: bool = False  # its mask was late: it sits this step out (see _await_masks)
    prompt_len: int = 0

    @property
    def ready(self) -> bool:
        """Prefilled: `logits` hold the next token's, so step() samples and decodes it."""
        return self.length >= len(self.pending)


class EngineCore:
    """The state the layers of OnnxEngine share (set by OnnxEngine.__init__; each layer declares its own) and the
    slot table."""

    max_context: int
    layout: GraphLayout
    _pool: SlotPool
    _slots: list[EngineSequence]
    _seqs: dict[str, EngineSequence]
    _failed: dict[str, EngineError]
    prefix_cache: PrefixCache | None
    _warming: EngineSequence | None

    def kv_bytes_per_sequence(self) -> int:
        """Bytes of KV cache one sequence fills at its longest (what admission by memory budgets for)."""
        itemsize = self._pool.dtype.itemsize
        return sum(heads * rows * dim * itemsize for heads, rows, dim in self._pool.row_shapes)

    # -- internals ---------------------------------------------------------------------------

    def _decoding(self, seq: EngineSequence) -> bool:
        # Done warming, it stays in its slot (see warm); one whose mask is late sits the step out.
        return seq.ready and not seq.held and seq is not self._warming

    def _pack_ready(self) -> None:
        """Keep ready sequences in the lowest slots (a decode batch is a run of consecutive slots): swap
        the first prefilling (or warming) slot with the last ready one until they are in order."""
        slots = self._slots
        low, high = 0, len(slots) - 1
        while True:
            while low < len(slots) and self._decoding(slots[low]):
                low += 1
            while high >= 0 and not self._decoding(slots[high]):
                high -= 1
            if low >= high:
                return
            a, b = slots[low], slots[high]
            self._pool.swap(a.slot, b.slot, a.length, b.length)
            a.slot, b.slot = high, low
            slots[low], slots[high] = b, a

    def _remember(self, seq: EngineSequence) -> None:
        if self.prefix_cache is not None and seq.slot >= 0 and seq.prefilled > 0:
            n = seq.prefilled  # decoded rows are not what a prefill of the same tokens would compute
            self.prefix_cache.put(seq.tokens[:n], [arr[seq.slot, :, :n].copy() for arr in self._pool.arrays])

    def _acquire(self, seq: EngineSequence) -> None:
        lay = self.layout
        if lay.shared_buffer:
            self._pool.ensure(len(self._slots) + 1, [(s.slot, s.length) for s in self._slots])
            seq.slot = len(self._slots)
            self._slots.append(seq)
        else:
            empty: np.ndarray = np.zeros((1, lay.kv_heads, 0, lay.head_dim), dtype=lay.kv_dtype)
            seq.past = [ort.OrtValue.ortvalue_from_numpy(empty) for _ in lay.past_names]

    def _release(self, seq: EngineSequence) -> None:
        self._remember(seq)
        if seq.slot >= 0:
            # Keep slots 0..n-1 dense: the last slot's sequence moves into the hole (its filled prefix
            # only). Stale contents beyond a sequence's length are fine: seqlens bound what GQA reads.
            last = self._slots.pop()
            if last is not seq:
                self._pool.move(last.slot, seq.slot, last.length)
                last.slot = seq.slot
                self._slots[seq.slot] = last
            seq.slot = -1
            if not self._slots:
                self._pool.clear()  # idle: give the cache's pages back
        seq.past = []
