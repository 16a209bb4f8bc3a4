"""The ONNX Runtime decoder engine: a table of active sequences, each with its own KV cache.

Threading: add_sequence / step / remove_sequence are called serially from one worker thread
(the supervisor's asyncio.to_thread); nothing here locks. ONNX Runtime releases the GIL while
it computes, so the event loop keeps serving meanwhile.

Batching: with the shared-buffer layout `step()` decodes all decoding sequences in one run at batch n
(right-padded attention mask; GQA reads each row's own length from it). Prefill and resume replay
run at batch 1 in the sequence's slot. MatMulNBits (accuracy_level 4) quantizes activations per row
block (per-row int8: per row, with exact integer sums) and every other op is row-wise, so a row's logits
do not depend on the other rows of the batch;
tests/test_engine_onnx.py checks this (token-exact), which is what makes a resume at batch 1
reproduce a run that was decoded batched. The standard layout steps sequences one by one; `model quantize
SRC DST --layout contrib` (engine/convert.py) rewrites a standard-op fp32 model in the contrib layout, which batches.

The engine is built in layers, one module each, each a subclass of the one below it: core.py (the state they
share, the slot table of the KV pool in kv_pool.py), run_binding.py (model runs and the IOBinding cache),
masks.py (grammar masks beside the forward pass, with deadlines), prefill_schedule.py (chunked prefill under a
per-step budget, paced), prefix_warming.py (prefix reuse and warming); this module opens the model and
implements the Engine protocol over them."""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
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
from service.engine.compact import read_head_ids
from service.engine.config import read_config
from service.engine.core import EngineSequence
from service.engine.cpu import cpu_features
from service.engine.info_moe import expert_bits
from service.engine.kv_pool import SlotPool, window_capacities
from service.engine.layout import GraphLayout, detect_layout
from service.engine.model_files import find_model_file
from service.engine.prefill_pacer import DEFAULT_STALL_RATIO, PrefillPacer
from service.engine.prefill_schedule import PREFILL_LOGITS_BUDGET
from service.engine.prefix_cache import PrefixCache
from service.engine.prefix_warming import WARM_QUEUE, PrefixWarming
from service.engine.run_binding import BoundRun, float_logits_width
from service.engine.sampling import sample


def default_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


class OnnxEngine(PrefixWarming):
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
        # A compact head's ids: every other id's logit is UNSEEN_LOGIT, so the sampler draws over these alone.
        self.head_ids = read_head_ids(self.model_dir, meta.extra, self.config.vocab_size)
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
        self._pool = SlotPool(shapes, lay.kv_dtype)
        # Decode runs' bindings, by (first slot, rows): the pool's tensors stay bound between runs (see _bound_run).
        self._bound: dict[tuple[int, int], BoundRun] = {}
        self._logits_width = float_logits_width(self.session, lay.logits_name) if lay.shared_buffer else None
        self._slots: list[EngineSequence] = []  # shared-buffer layout: _slots[i].slot == i
        # Largest batch one decode run takes (more active sequences run in several batches). 1 where this
        # CPU's kernels would give a row other bits in a batch than alone, which a resume at batch 1 needs.
        int4_dense = (meta.extra.get("quantization") or {}).get("bits") == 4  # `model import --bits 4`
        unbatchable = not cpu_features().int4_experts_batch_invariant and (
            int4_dense or 4 in expert_bits(find_model_file(self.model_dir))
        )  # the graph is read only on CPUs where it matters
        self.max_batch = 1 if unbatchable else max_batch
        last_only = meta.extra.get("logits") == "last_position"
        self._prefill_chunk = (
            self.max_context if last_only else max(16, PREFILL_LOGITS_BUDGET // self.config.vocab_size)
        )
        self._seqs: dict[str, EngineSequence] = {}  # in arrival order: prefill is first come first served
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
        self._to_warm: deque[list[int]] = deque(maxlen=WARM_QUEUE)
        self._warming: EngineSequence | None = None  # the one being prefilled (it holds a KV slot)

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
        seq = EngineSequence(params, constraint, [], 0, len(generated_ids), np.empty(0, np.float32))
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
        going: list[tuple[EngineSequence, int]] = []
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

    def _decode(self, going: list[tuple[EngineSequence, int]]) -> None:
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

    def pop_failures(self) -> dict[str, EngineError]:
        failed, self._failed = self._failed, {}
        return failed

    def _sample(self, seq: EngineSequence) -> TokenOutput:
        allowed = seq.constraint.allowed_token_ids() if seq.constraint is not None else None
        out = sample(seq.logits, seq.params, seq.generated, allowed, seq.counts, support=self.head_ids)
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


def check_int8_kernels(scheme: dict[str, Any]) -> None:
    """Refuse int8 weights whose kernel would compute wrong sums on this CPU: per-row int8 built as u8s8 (on a
    CPU with VNNI) needs VNNI, since MLAS's u8s8 path without it saturates int16 pair sums."""
    if scheme.get("qgemm") == "u8s8" and not cpu_features().has_vnni:
        raise EngineError(
            "its per-row int8 weights were built for a CPU with VNNI (u8s8 kernels) and this CPU has none "
            f"({cpu_features().int8_kernel}), where those kernels saturate; rebuild the model on this machine "
            "(model build-random, model quantize or model import choose its int8 layout for the CPU they run on)"
        )
