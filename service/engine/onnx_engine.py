"""The ONNX Runtime decoder engine: a table of active sequences, each with its own KV cache.

Threading: add_sequence / step / remove_sequence are called serially from one worker thread
(the supervisor's asyncio.to_thread); nothing here locks. ONNX Runtime releases the GIL while
it computes, so the event loop keeps serving meanwhile.

KV cache: with GroupQueryAttention graphs (ours, onnxruntime-genai's) the cache is one pooled
[slots, kv_heads, max_context, d] buffer per layer and K/V (see _SlotPool); each sequence owns one
slot and the active sequences always hold slots 0..n-1. A run binds the rows it needs by pointer,
as both past input and present output, so GQA writes the cache in place: nothing is copied per step.
With the standard Concat layout (Optimum exports) each sequence's cache stays as ORT-owned OrtValues
passed from present to past, never through numpy.

Batching: with the shared-buffer layout `step()` decodes all decoding sequences in one run at batch n
(right-padded attention mask; GQA reads each row's own length from it). Prefill and resume replay
run at batch 1 in the sequence's slot. MatMulNBits (accuracy_level 4) quantizes activations per row
block (per-row int8: per row, with exact integer sums) and every other op is row-wise, so a row's logits
do not depend on the other rows of the batch;
tests/test_engine_onnx.py checks this (token-exact), which is what makes a resume at batch 1
reproduce a run that was decoded batched. The standard layout steps sequences one by one; `model quantize
SRC DST --layout contrib` (engine/convert.py) rewrites a standard-op fp32 model in the contrib layout, which batches.

Chunked prefill: add_sequence only validates and registers a sequence; its prompt (and, on resume, its
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
decodes them as one batch.

Constraints: after a step has sampled (and fed every constraint its token), the next step's masks
are computed in worker threads while the model runs (llguidance releases the GIL), so grammar
masks cost little wall time. Masks are pure functions of a constraint's state, so when they are
computed never changes what is sampled. Unconstrained sequences skip all of it. Each sequence's mask
is a job of its own with a deadline (`mask_deadline_s` from its submission): the next step waits for
a mask that long at most, then fails that sequence alone (pop_failures) and samples the others; the
late job runs on in its thread, abandoned, and a fresh pool takes the next masks. A constraint whose
`failure()` (optional) reports a grammar's exhausted per-step fuel is failed the same way.
"""

from __future__ import annotations

import json
import mmap
import os
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from service.engine.base import (
    DEFAULT_MASK_DEADLINE_S,
    EngineError,
    FinishReason,
    LogitsConstraint,
    SamplingParams,
    TokenOutput,
)
from service.engine.config import read_config
from service.engine.cpu import cpu_features
from service.engine.info_moe import expert_bits
from service.engine.layout import GraphLayout, detect_layout
from service.engine.model_files import find_model_file
from service.engine.prefill_pacer import DEFAULT_STALL_RATIO, PrefillPacer
from service.engine.prefix_cache import PrefixCache, common_prefix_length
from service.engine.sampling import sample

_PREFILL_LOGITS_BUDGET = 1 << 25  # floats of logits one prefill chunk may produce (full-logits graphs)
# What one replayed token (a 1-token run) costs of the prefill budget: a run reads all the weights
# whatever its length, so on CPU it costs about what a run of a few dozen prompt tokens costs.
_REPLAY_COST = 16
# Threads computing grammar masks beside the forward pass (one job per sequence).
_MASK_THREADS = max(1, min(4, (os.cpu_count() or 2) // 2))
# How long a step waits for a mask not ready when it starts (it had the last decode's time to run beside the model)
# before its sequence sits the step out.
_MASK_GRACE_S = 0.002
# With no other sequence to step, how long a step waits for a late mask before returning empty-handed: the engine
# thread comes back soon to admit newcomers, which would otherwise wait for the slow mask.
_ALONE_MASK_WAIT_S = 0.01
# Prompts warm_prefix() keeps for warm() to prefill (the most recent ones).
_WARM_QUEUE = 4
# Decode bindings kept (one per run of slots a decode step takes: batch sizes, chunks past max_batch, slots of
# sequences decoded alone); past it they are dropped and bound again as needed.
_BOUND_RUNS = 64
# A prompt to warm that starts with all but this many of the warming sequence's rows retargets it (see warm).
_RETARGET_SLACK = 8


@dataclass(frozen=True)
class _MaskJob:
    future: Future[Any]
    submitted: float  # time.monotonic()
    pool: ThreadPoolExecutor


@dataclass
class _Sequence:
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
    mask_job: _MaskJob | None = None
    held: bool = False  # its mask was late: it sits this step out (see _await_masks)
    prompt_len: int = 0

    @property
    def ready(self) -> bool:
        """Prefilled: `logits` hold the next token's, so step() samples and decodes it."""
        return self.length >= len(self.pending)


class _SlotPool:
    """One [capacity, kv_heads, rows, d] array per past tensor; slot i is row i of each.

    `rows` is max_context, or a sliding-window layer's cache capacity (GQA with sliding_window_cache
    keeps the most recent positions there and evicts on its own). Rows are bound to the session by
    pointer (a contiguous run of slots along axis 0 is one [slots, kv_heads, rows, d] tensor), so a
    batch over slots 0..n-1 needs no gather. Arrays are anonymous mappings (_lazy_zeros): pages are
    committed only as GQA writes them, and growing never clears untouched rows. The pool grows by
    doubling, copying only each live slot's filled prefix."""

    def __init__(self, row_shapes: list[tuple[int, int, int]], dtype: type) -> None:
        self.row_shapes = row_shapes
        self.dtype = np.dtype(dtype)
        self.arrays: list[np.ndarray] = []
        self.capacity = 0
        self.generation = 0  # bumped whenever `arrays` are replaced: bindings to the old ones are stale

    def ensure(self, capacity: int, live: list[tuple[int, int]]) -> None:
        """Room for `capacity` slots; `live` are (slot, filled length) pairs to keep."""
        if capacity <= self.capacity:
            return
        new_cap = max(capacity, 2 * self.capacity, 1)
        arrays = [_lazy_zeros((new_cap, *shape), self.dtype) for shape in self.row_shapes]
        for old, new in zip(self.arrays, arrays, strict=False):
            for slot, length in live:
                new[slot, :, :length] = old[slot, :, :length]  # a window cache's resident rows are a prefix
        self.arrays, self.capacity = arrays, new_cap
        self.generation += 1

    def clear(self) -> None:
        self.arrays, self.capacity = [], 0
        self.generation += 1

    def move(self, src: int, dst: int, length: int) -> None:
        for arr in self.arrays:
            arr[dst, :, :length] = arr[src, :, :length]

    def swap(self, a: int, b: int, len_a: int, len_b: int) -> None:
        for arr in self.arrays:
            keep = arr[a, :, :len_a].copy()
            arr[a, :, :len_b] = arr[b, :, :len_b]
            arr[b, :, :len_a] = keep

    def bind(self, io: ort.IOBinding, past_names: list[str], present_names: list[str], first: int, rows: int) -> None:
        for past, present, arr in zip(past_names, present_names, self.arrays, strict=True):
            shape = [rows, *arr.shape[1:]]
            ptr = arr[first].ctypes.data
            io.bind_input(past, "cpu", 0, self.dtype.type, shape, ptr)
            io.bind_output(present, "cpu", 0, self.dtype.type, shape, ptr)  # written in place


@dataclass
class _BoundRun:
    """An IOBinding with a run of the pool's slots bound in place (as of the pool's `generation`) and the logits
    buffer its runs write (see OnnxEngine._bound_run)."""

    generation: int
    io: ort.IOBinding
    logits: np.ndarray


def _float_logits_width(session: ort.InferenceSession, name: str) -> int | None:
    """The vocabulary axis of a float32 logits output, when the graph states it (else None: bound per run)."""
    for output in session.get_outputs():
        if output.name == name and output.type == "tensor(float)" and output.shape:
            width = output.shape[-1]
            return width if isinstance(width, int) and width > 0 else None
    return None


def _lazy_zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zero array in an anonymous private mapping of its own: the kernel maps each page, zeroed, on its
    first write, so a KV pool costs memory only for the rows sequences fill, and growing it writes only the
    live rows it copies. (np.zeros of such sizes may come from the heap, where calloc clears every byte:
    seconds for a pool of 16 Qwen-shape slots, stalling every stream while a burst of newcomers is admitted.)"""
    count = int(np.prod(shape))
    buffer = mmap.mmap(-1, max(1, count * dtype.itemsize), flags=mmap.MAP_PRIVATE)
    return np.frombuffer(buffer, dtype=dtype, count=count).reshape(shape)


def default_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


class OnnxEngine:
    """Implements service.engine.base.Engine over a decoder-with-past ONNX model directory."""

    def __init__(
        self,
        model_dir: Path,
        *,
        intra_op_threads: int | None = None,
        max_batch: int = 32,
        prefix_cache_bytes: int = 0,
        prefill_tokens: int = 256,
        prefill_stall_ratio: float = DEFAULT_STALL_RATIO,
        mask_deadline_s: float = DEFAULT_MASK_DEADLINE_S,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.mask_deadline_s = mask_deadline_s
        meta = read_config(self.model_dir)
        self.config = meta.decoder
        self.model_id: str = meta.model_id or self.model_dir.name
        self.max_context: int = int(meta.extra.get("max_context", self.config.max_position))
        check_int8_kernels(meta.extra.get("quantization") or {})
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = intra_op_threads or default_threads()
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(
            str(find_model_file(self.model_dir)), opts, providers=["CPUExecutionProvider"]
        )
        shared = meta.extra.get("kv_cache") == "shared_buffer"
        names = meta.extra.get("io_names")
        self.layout: GraphLayout = detect_layout(self.session, self.config, shared_buffer=shared, names=names)
        lay = self.layout
        windows = window_capacities(self.model_dir, meta.extra)
        shapes = [
            (lay.kv_heads, windows.get(i // 2, self.max_context), lay.head_dim) for i in range(len(lay.past_names))
        ]
        self._pool = _SlotPool(shapes, lay.kv_dtype)
        # Decode runs' bindings, by (first slot, rows): the pool's tensors stay bound between runs (see _bound_run).
        self._bound: dict[tuple[int, int], _BoundRun] = {}
        self._logits_width = _float_logits_width(self.session, lay.logits_name) if lay.shared_buffer else None
        self._slots: list[_Sequence] = []  # shared-buffer layout: _slots[i].slot == i
        # Largest batch one decode run takes (more active sequences run in several batches). 1 where this
        # CPU's kernels would give a row other bits in a batch than alone, which a resume at batch 1 needs.
        unbatchable = not cpu_features().int4_experts_batch_invariant and 4 in expert_bits(
            find_model_file(self.model_dir)
        )  # the graph is read only on CPUs where it matters
        self.max_batch = 1 if unbatchable else max_batch
        last_only = meta.extra.get("logits") == "last_position"
        self._prefill_chunk = (
            self.max_context if last_only else max(16, _PREFILL_LOGITS_BUDGET // self.config.vocab_size)
        )
        self._seqs: dict[str, _Sequence] = {}  # in arrival order: prefill is first come first served
        # Prompt tokens (a replayed token counts _REPLAY_COST) one step prefills before it decodes.
        self.prefill_tokens = max(2, prefill_tokens)
        # While others decode, a step's prefill may also be bounded in time (prefill_pacer; ratio 0: it is not).
        self.prefill_pacer = PrefillPacer(prefill_stall_ratio)
        self._failed: dict[str, EngineError] = {}  # sequences whose prefill failed, until pop_failures()
        # Shared-buffer graphs without sliding windows: a row's keys and values do not depend on its batch or
        # chunk, so prompts may be cut anywhere (2+ tokens a run), and finished sequences' KV rows are reused
        # by prompts that start with their tokens.
        self._cut_anywhere = lay.shared_buffer and not windows
        reusable = self._cut_anywhere and prefix_cache_bytes > 0
        self.prefix_cache = PrefixCache(prefix_cache_bytes) if reusable else None
        self._mask_pool: ThreadPoolExecutor | None = None  # started on the first constrained step
        # Prompts expected soon (warm_prefix), prefilled into the prefix cache by warm().
        self._to_warm: deque[list[int]] = deque(maxlen=_WARM_QUEUE)
        self._warming: _Sequence | None = None  # the one being prefilled (it holds a KV slot)

    # -- Engine protocol ---------------------------------------------------------------------

    def add_sequence(
        self,
        seq_id: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        constraint: LogitsConstraint | None = None,
        generated_ids: Sequence[int] = (),
    ) -> None:
        if seq_id in self._seqs:
            raise EngineError(f"sequence {seq_id!r} is already active")
        ids = [*prompt_ids, *generated_ids]
        if not prompt_ids:
            raise EngineError("empty prompt")
        if len(ids) >= self.max_context:
            raise EngineError(f"prompt of {len(ids)} tokens does not fit the context of {self.max_context}")
        if len(generated_ids) >= params.max_new_tokens:
            raise EngineError("sequence already generated max_new_tokens")
        vocab = self.config.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise EngineError(f"token id out of range for vocabulary of {vocab}")
        seq = _Sequence(params, constraint, [], 0, len(generated_ids), np.empty(0, np.float32))
        seq.pending, seq.prompt_len = [int(t) for t in ids], len(prompt_ids)
        if params.frequency_penalty or params.presence_penalty:
            for token in generated_ids:
                seq.counts[token] = seq.counts.get(token, 0) + 1
        # A newcomer has the engine: warming ends, its sequence handed over when the prompt starts with its rows,
        # else cached.
        if not self._adopt_warming(seq, list(prompt_ids)):
            self._end_warming()
            self._acquire(seq)
            try:
                self._reuse_prefix(seq, list(prompt_ids))  # rows before seq.length come from the prefix cache
            except BaseException:
                self._release(seq)
                raise
        self._seqs[seq_id] = seq  # prefilled by the next steps (see _prefill_some)

    def step(self) -> dict[str, TokenOutput]:
        """Prefill newcomers within the budget, then sample every ready sequence and decode those going on."""
        self._prefill_some()
        self._await_masks()
        results: dict[str, TokenOutput] = {}
        going: list[tuple[_Sequence, int]] = []
        for seq_id, seq in list(self._seqs.items()):
            if not seq.ready or seq.held:
                continue
            seq.mask_job = None
            out = self._sample(seq)
            results[seq_id] = out
            if out.finish_reason is not None:
                self._release(self._seqs.pop(seq_id))
            else:
                going.append((seq, out.token_id))
                if seq.constraint is not None:
                    # The next step's mask, computed while the model runs (llguidance drops the GIL).
                    self._submit_mask(seq)
        self._pack_ready()
        self._decode(going)
        return results

    def _submit_mask(self, seq: _Sequence) -> None:
        if self._mask_pool is None:
            self._mask_pool = ThreadPoolExecutor(max_workers=_MASK_THREADS, thread_name_prefix="masks")
        assert seq.constraint is not None
        job = self._mask_pool.submit(seq.constraint.allowed_token_ids)
        seq.mask_job = _MaskJob(job, time.monotonic(), self._mask_pool)

    def _await_masks(self) -> None:
        """Settle every ready constrained sequence's next mask before sampling. One not ready within a short grace
        (it ran beside the last decode: the others never wait for it longer) sits this step out, its state untouched
        (`held`); one not ready by its deadline, or whose grammar ran out of fuel, is dropped and reported by
        pop_failures(). A job still running past the grace keeps its thread: later masks go to a fresh pool, and
        jobs queued behind it move there (with a fresh deadline: the wait was not theirs)."""
        waiting = [(seq_id, seq) for seq_id, seq in self._seqs.items() if seq.ready and seq.constraint is not None]
        for _, seq in waiting:
            seq.held = False
            if seq.mask_job is None:  # just prefilled
                self._submit_mask(seq)
        # With nobody else to step, a late mask is waited for longer (polled in slices: newcomers come in between).
        others = len(waiting) > 1 or any(seq.constraint is None or not seq.ready for seq in self._seqs.values())
        grace = _MASK_GRACE_S if others else _ALONE_MASK_WAIT_S
        pending = self._wait_masks(waiting, time.monotonic() + grace)
        queued = [(seq_id, seq) for seq_id, seq in pending if seq.mask_job is not None and seq.mask_job.future.cancel()]
        stuck = [seq.mask_job for _, seq in pending if seq.mask_job is not None and not seq.mask_job.future.cancelled()]
        if self._mask_pool is not None and any(job.pool is self._mask_pool for job in stuck):
            self._mask_pool.shutdown(wait=False)  # its threads end when their jobs do
            self._mask_pool = None
        if queued:
            for _, seq in queued:
                self._submit_mask(seq)
            pending = [item for item in pending if item not in queued]
            pending += self._wait_masks(queued, time.monotonic() + grace)
        now = time.monotonic()
        for seq_id, seq in pending:
            job = seq.mask_job
            if job is not None and job.future.done():
                continue  # ready since
            if job is None or now - job.submitted >= self.mask_deadline_s:
                self._fail(
                    seq_id,
                    EngineError(
                        f"the response format's grammar took longer than {self.mask_deadline_s:g} s to compute the "
                        "next token's mask; the run was stopped (simplify the schema or grammar)"
                    ),
                )
            else:
                seq.held = True
        for seq_id, seq in list(self._seqs.items()):
            failure = getattr(seq.constraint, "failure", None) if seq.ready and not seq.held else None
            reason = failure() if failure is not None else None
            if reason:
                self._fail(seq_id, EngineError(f"the response format's grammar is too complex to follow: {reason}"))

    def _wait_masks(self, waiting: list[tuple[str, _Sequence]], grace_end: float) -> list[tuple[str, _Sequence]]:
        """Wait for the jobs until `grace_end` (or their deadlines, if sooner); the sequences whose masks are not
        ready then. A job that raised fails its own sequence."""
        pending: list[tuple[str, _Sequence]] = []
        for seq_id, seq in waiting:
            job = seq.mask_job
            assert job is not None
            end = min(job.submitted + self.mask_deadline_s, grace_end)
            try:
                job.future.result(timeout=max(0.0, end - time.monotonic()))
            except TimeoutError:
                pending.append((seq_id, seq))
            except CancelledError:
                pending.append((seq_id, seq))
            except Exception as exc:  # noqa: BLE001 - a constraint's bug fails its own sequence, not the batch
                self._fail(seq_id, EngineError(f"grammar mask: {exc}"))
        return pending

    def _fail(self, seq_id: str, error: EngineError) -> None:
        seq = self._seqs.pop(seq_id, None)
        if seq is not None:
            seq.mask_job = None
            self._release(seq)
            self._failed[seq_id] = error

    def _decode(self, going: list[tuple[_Sequence, int]]) -> None:
        if not going:
            return
        started = time.perf_counter()
        if self.layout.shared_buffer:
            going.sort(key=lambda st: st[0].slot)  # rows in slot order: slots 0..n-1 are one tensor
            for start in range(0, len(going), self.max_batch):
                self._decode_batch(going[start : start + self.max_batch])
        else:
            for seq, token in going:
                self._forward(seq, [token])
        self.prefill_pacer.observe_decode(time.perf_counter() - started)

    def remove_sequence(self, seq_id: str) -> None:
        self._failed.pop(seq_id, None)
        seq = self._seqs.pop(seq_id, None)
        if seq is not None:
            if seq.mask_job is not None:
                seq.mask_job.future.cancel()  # a running one ends on its own; nobody reads it
            self._release(seq)

    def active_sequence_ids(self) -> list[str]:
        return list(self._seqs)

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

    def pop_failures(self) -> dict[str, EngineError]:
        failed, self._failed = self._failed, {}
        return failed

    def prefilling_sequence_ids(self) -> list[str]:
        """Active sequences whose prefill is not done yet (they yield no token until it is)."""
        return [seq_id for seq_id, seq in self._seqs.items() if not seq.ready]

    def kv_bytes_per_sequence(self) -> int:
        """Bytes of KV cache one sequence fills at its longest (what admission by memory budgets for)."""
        itemsize = self._pool.dtype.itemsize
        return sum(heads * rows * dim * itemsize for heads, rows, dim in self._pool.row_shapes)

    # -- internals ---------------------------------------------------------------------------

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

    def _prefill_run(self, seq: _Sequence, n: int) -> None:
        """The next `n` of the sequence's pending tokens, in one run (timed for the pacer)."""
        started = time.perf_counter()
        self._forward(seq, seq.pending[seq.length : seq.length + n])
        self.prefill_pacer.observe_prefill(n, time.perf_counter() - started)

    def _next_run(self, seq: _Sequence, room: int) -> int:
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

    def _decoding(self, seq: _Sequence) -> bool:
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

    def _sample(self, seq: _Sequence) -> TokenOutput:
        allowed = seq.constraint.allowed_token_ids() if seq.constraint is not None else None
        out = sample(seq.logits, seq.params, seq.generated, allowed, seq.counts)
        if seq.constraint is not None:
            seq.constraint.accept(out.token_id)
        if seq.params.frequency_penalty or seq.params.presence_penalty:
            seq.counts[out.token_id] = seq.counts.get(out.token_id, 0) + 1
        seq.generated += 1
        reason: FinishReason | None = None
        if out.token_id in seq.params.stop_token_ids:
            reason = "stop"
        elif seq.generated >= seq.params.max_new_tokens or seq.length + 1 >= self.max_context:
            reason = "length"
        if reason is None:
            return out
        return TokenOutput(out.token_id, out.logprob, out.top_logprobs, finish_reason=reason)

    def _reuse_prefix(self, seq: _Sequence, ids: list[int], *, count_hit: bool = True) -> int:
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

    def _reuse_live_prefix(self, seq: _Sequence, ids: list[int]) -> None:
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

    def _take_rows(self, seq: _Sequence, ids: list[int], n: int, rows: list[np.ndarray]) -> None:
        """Copy the first `n` rows of `rows` (one [kv_heads, tokens, head_dim] array per past tensor) into the
        sequence's slot: it then holds `ids[:n]`, as if it had prefilled them."""
        for arr, source in zip(self._pool.arrays, rows, strict=True):
            arr[seq.slot, :, :n] = source[:, :n]
        seq.length = seq.prefilled = n
        seq.tokens = list(ids[:n])

    def _warm_work_left(self) -> bool:
        return bool(self._to_warm) or (self._warming is not None and not self._warming.ready)

    def _rows_kept_for(self, seq: _Sequence, ids: list[int]) -> int:
        """How many leading rows of the warming sequence the prompt `ids` starts with."""
        return common_prefix_length(seq.tokens[: seq.prefilled], ids)

    def _extends(self, seq: _Sequence, ids: list[int]) -> bool:
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
        seq = self._warming = _Sequence(SamplingParams(max_new_tokens=1), None, [], 0, 0, np.empty(0, np.float32))
        seq.pending, seq.prompt_len = ids, len(ids)
        self._acquire(seq)
        self._reuse_prefix(seq, ids, count_hit=False)
        self._reuse_live_prefix(seq, ids)

    def _adopt_warming(self, seq: _Sequence, ids: list[int]) -> bool:
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

    def _remember(self, seq: _Sequence) -> None:
        if self.prefix_cache is not None and seq.slot >= 0 and seq.prefilled > 0:
            n = seq.prefilled  # decoded rows are not what a prefill of the same tokens would compute
            self.prefix_cache.put(seq.tokens[:n], [arr[seq.slot, :, :n].copy() for arr in self._pool.arrays])

    def _acquire(self, seq: _Sequence) -> None:
        lay = self.layout
        if lay.shared_buffer:
            self._pool.ensure(len(self._slots) + 1, [(s.slot, s.length) for s in self._slots])
            seq.slot = len(self._slots)
            self._slots.append(seq)
        else:
            empty: np.ndarray = np.zeros((1, lay.kv_heads, 0, lay.head_dim), dtype=lay.kv_dtype)
            seq.past = [ort.OrtValue.ortvalue_from_numpy(empty) for _ in lay.past_names]

    def _release(self, seq: _Sequence) -> None:
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

    def _bound_run(self, first: int, rows: int) -> _BoundRun | None:
        """The binding of a one-token run over slots first..first+rows-1 (shared-buffer graphs with float32 logits of
        a known width): their KV tensors bound in place and a logits buffer of its own, kept while the pool keeps its
        arrays, so that a decode step binds only its inputs (binding 48 tensors and wrapping every output after
        the run cost ~0.5 ms a step, ~2% of a Qwen-shape step at batch 1). A run's logits stay in its buffer until
        the same slots' next one-token run, which comes after the step that draws from them."""
        if self._logits_width is None:
            return None
        pool, lay = self._pool, self.layout
        bound = self._bound.get((first, rows))
        if bound is not None and bound.generation == pool.generation:
            return bound
        if len(self._bound) >= _BOUND_RUNS:
            self._bound.clear()
        io = self.session.io_binding()
        logits = np.empty((rows, 1, self._logits_width), dtype=np.float32)
        io.bind_output(lay.logits_name, "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data)
        pool.bind(io, lay.past_names, lay.present_names, first, rows)
        bound = self._bound[(first, rows)] = _BoundRun(pool.generation, io, logits)
        return bound

    def _decode_batch(self, batch: list[tuple[_Sequence, int]]) -> None:
        """One token for each of `batch` (consecutive slots) in one run of the shared-buffer graph."""
        if len(batch) == 1:
            self._forward(batch[0][0], [batch[0][1]])
            return
        lay = self.layout
        seqs = [seq for seq, _ in batch]
        first, rows = seqs[0].slot, len(seqs)
        assert [s.slot for s in seqs] == list(range(first, first + rows))
        lengths = np.array([s.length for s in seqs], dtype=np.int64)
        bound = self._bound_run(first, rows)
        io = bound.io if bound is not None else self.session.io_binding()
        io.bind_cpu_input("input_ids", np.array([[tok] for _, tok in batch], dtype=np.int64))
        if lay.has_attention_mask:  # right-padded: row b has lengths[b] + 1 ones
            total = int(lengths.max()) + 1
            io.bind_cpu_input("attention_mask", (np.arange(total)[None] <= lengths[:, None]).astype(np.int64))
        if lay.has_position_ids:
            io.bind_cpu_input("position_ids", lengths[:, None].copy())
        if lay.has_use_cache_branch:
            io.bind_cpu_input("use_cache_branch", np.array([True]))
        if bound is None:
            io.bind_output(lay.logits_name, "cpu")  # first: outs[0]
            self._pool.bind(io, lay.past_names, lay.present_names, first, rows)
        self.session.run_with_iobinding(io)
        # Rows stay views of it until the next step has drawn from them, before any run rewrites it.
        logits = bound.logits if bound is not None else io.get_outputs()[0].numpy()
        for b, (seq, token) in enumerate(batch):
            seq.logits = logits[b, -1]
            seq.length += 1
            seq.tokens.append(token)

    def _forward(self, seq: _Sequence, ids: Sequence[int]) -> None:
        """Run ids through the model after the cached tokens; updates the cache and next-token logits."""
        lay = self.layout
        n = len(ids)
        bound = self._bound_run(seq.slot, 1) if n == 1 else None  # a decoded (or replayed) token
        io = bound.io if bound is not None else self.session.io_binding()
        io.bind_cpu_input("input_ids", np.asarray([ids], dtype=np.int64))
        if lay.has_attention_mask:
            io.bind_cpu_input("attention_mask", np.ones((1, seq.length + n), dtype=np.int64))
        if lay.has_position_ids:
            io.bind_cpu_input("position_ids", np.arange(seq.length, seq.length + n, dtype=np.int64)[None])
        if lay.has_use_cache_branch:
            io.bind_cpu_input("use_cache_branch", np.array([seq.length > 0]))
        if bound is not None:
            self.session.run_with_iobinding(io)
            seq.logits = bound.logits[0, -1]
        else:
            io.bind_output(lay.logits_name, "cpu")  # first: outs[0]
            if lay.shared_buffer:
                self._pool.bind(io, lay.past_names, lay.present_names, seq.slot, 1)
            else:
                for name, value in zip(lay.past_names, seq.past, strict=True):
                    io.bind_ortvalue_input(name, value)
                for name in lay.present_names:
                    io.bind_output(name, "cpu")
            self.session.run_with_iobinding(io)
            outs = io.get_outputs()
            seq.logits = np.asarray(outs[0].numpy()[0, -1], dtype=np.float32)
            if not lay.shared_buffer:
                seq.past = list(outs[1:])
        if n >= 2 and seq.prefilled == seq.length:
            seq.prefilled += n
        seq.length += n
        seq.tokens.extend(ids)


def check_int8_kernels(scheme: dict[str, Any]) -> None:
    """Refuse int8 weights whose kernel would compute wrong sums on this CPU: per-row int8 built as u8s8 (on a
    CPU with VNNI) needs VNNI, since MLAS's u8s8 path without it saturates int16 pair sums."""
    if scheme.get("qgemm") == "u8s8" and not cpu_features().has_vnni:
        raise EngineError(
            "its per-row int8 weights were built for a CPU with VNNI (u8s8 kernels) and this CPU has none "
            f"({cpu_features().int8_kernel}), where those kernels saturate; rebuild the model on this machine "
            "(model build-random / model quantize --block-size row), which stores them for the exact u8u8 kernels"
        )


def window_capacities(model_dir: Path, extra: dict[str, Any]) -> dict[int, int]:
    """Layers whose KV cache is a sliding window (GQA sliding_window_cache): layer -> cache rows.

    Ours declare it in config.json ("kv_window"), onnxruntime-genai's in genai_config.json."""
    ours = extra.get("kv_window")
    if ours:
        return {int(layer): int(ours["capacity"]) for layer in ours["layers"]}
    path = model_dir / "genai_config.json"
    if not path.exists():
        return {}
    window = json.loads(path.read_text()).get("model", {}).get("decoder", {}).get("sliding_window")
    if not window:
        return {}
    capacity = int(window["window_size"]) + int(window.get("cache_slack", 0))
    return {int(layer): capacity for layer in window.get("layers", [])}
