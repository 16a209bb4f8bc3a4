"""The ONNX Runtime decoder engine: a table of active sequences, each with its own KV cache.

Threading: add_sequence / step / remove_sequence are called serially from one worker thread
(the supervisor's asyncio.to_thread); nothing here locks. ONNX Runtime releases the GIL while
it computes, so the event loop keeps serving meanwhile.

KV cache: with GroupQueryAttention graphs (ours, onnxruntime-genai's) each sequence owns one
preallocated [1, kv_heads, max_context, d] buffer per layer and K/V, bound with IO binding as both
past input and present output, so the cache is written in place and never copied or reallocated
(buffers are pooled across sequences). With the standard Concat layout (Optimum exports) the cache
stays as ORT-owned OrtValues passed from present to past, never through numpy.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from service.engine.base import EngineError, FinishReason, LogitsConstraint, SamplingParams, TokenOutput
from service.engine.config import read_config
from service.engine.layout import GraphLayout, detect_layout
from service.engine.quantize import find_model_file
from service.engine.sampling import sample

_PREFILL_LOGITS_BUDGET = 1 << 25  # floats of logits one prefill chunk may produce (full-logits graphs)


@dataclass
class _Sequence:
    params: SamplingParams
    constraint: LogitsConstraint | None
    past: list[ort.OrtValue]
    length: int  # tokens in the KV cache
    generated: int  # tokens sampled so far, including those replayed on resume
    logits: np.ndarray  # next-token logits, waiting for the next step


def default_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


class OnnxEngine:
    """Implements service.engine.base.Engine over a decoder-with-past ONNX model directory."""

    def __init__(self, model_dir: Path, *, intra_op_threads: int | None = None) -> None:
        self.model_dir = Path(model_dir)
        meta = read_config(self.model_dir)
        self.config = meta.decoder
        self.model_id: str = meta.model_id or self.model_dir.name
        self.max_context: int = int(meta.extra.get("max_context", self.config.max_position))
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = intra_op_threads or default_threads()
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(
            str(find_model_file(self.model_dir)), opts, providers=["CPUExecutionProvider"]
        )
        shared = meta.extra.get("kv_cache") == "shared_buffer" or _genai_shares_buffer(self.model_dir)
        self.layout: GraphLayout = detect_layout(self.session, self.config, shared_buffer=shared)
        self._pool: list[list[ort.OrtValue]] = []  # free shared KV buffers
        last_only = meta.extra.get("logits") == "last_position"
        self._prefill_chunk = (
            self.max_context if last_only else max(16, _PREFILL_LOGITS_BUDGET // self.config.vocab_size)
        )
        self._seqs: dict[str, _Sequence] = {}

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
        seq = _Sequence(params, constraint, self._empty_past(), 0, len(generated_ids), np.empty(0, np.float32))
        # The prompt goes in the same chunks as in the original run and generated tokens one at a time,
        # as they were decoded: dynamic int8 quantizes activations per call, so only replaying the
        # same calls reproduces the same logits bit for bit (and so the same draws) after a crash.
        for start in range(0, len(prompt_ids), self._prefill_chunk):
            self._forward(seq, list(prompt_ids[start : start + self._prefill_chunk]))
        for token in generated_ids:
            self._forward(seq, [token])
        self._seqs[seq_id] = seq

    def step(self) -> dict[str, TokenOutput]:
        # Batch 1 per sequence for now; batched stepping changes only this method.
        results: dict[str, TokenOutput] = {}
        for seq_id, seq in list(self._seqs.items()):
            out = self._sample(seq)
            results[seq_id] = out
            if out.finish_reason is not None:
                self._release(self._seqs.pop(seq_id))
            else:
                self._forward(seq, [out.token_id])
        return results

    def remove_sequence(self, seq_id: str) -> None:
        seq = self._seqs.pop(seq_id, None)
        if seq is not None:
            self._release(seq)

    def active_sequence_ids(self) -> list[str]:
        return list(self._seqs)

    # -- internals ---------------------------------------------------------------------------

    def _sample(self, seq: _Sequence) -> TokenOutput:
        allowed = seq.constraint.allowed_token_ids() if seq.constraint is not None else None
        out = sample(seq.logits, seq.params, seq.generated, allowed)
        if seq.constraint is not None:
            seq.constraint.accept(out.token_id)
        seq.generated += 1
        reason: FinishReason | None = None
        if out.token_id in seq.params.stop_token_ids:
            reason = "stop"
        elif seq.generated >= seq.params.max_new_tokens or seq.length + 1 >= self.max_context:
            reason = "length"
        if reason is None:
            return out
        return TokenOutput(out.token_id, out.logprob, out.top_logprobs, finish_reason=reason)

    def _release(self, seq: _Sequence) -> None:
        if self.layout.shared_buffer and seq.past:
            self._pool.append(seq.past)  # stale contents are fine: the mask and seqlens bound what is read
        seq.past = []

    def _empty_past(self) -> list[ort.OrtValue]:
        lay = self.layout
        if lay.shared_buffer:
            if self._pool:
                return self._pool.pop()
            shape = (1, lay.kv_heads, self.max_context, lay.head_dim)
            return [ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, dtype=lay.kv_dtype)) for _ in lay.past_names]
        empty: np.ndarray = np.zeros((1, lay.kv_heads, 0, lay.head_dim), dtype=lay.kv_dtype)
        return [ort.OrtValue.ortvalue_from_numpy(empty) for _ in lay.past_names]

    def _forward(self, seq: _Sequence, ids: Sequence[int]) -> None:
        """Run ids through the model after the cached tokens; updates the cache and next-token logits."""
        lay = self.layout
        n = len(ids)
        io = self.session.io_binding()
        io.bind_cpu_input("input_ids", np.asarray([ids], dtype=np.int64))
        if lay.has_attention_mask:
            io.bind_cpu_input("attention_mask", np.ones((1, seq.length + n), dtype=np.int64))
        if lay.has_position_ids:
            io.bind_cpu_input("position_ids", np.arange(seq.length, seq.length + n, dtype=np.int64)[None])
        if lay.has_use_cache_branch:
            io.bind_cpu_input("use_cache_branch", np.array([seq.length > 0]))
        for name, value in zip(lay.past_names, seq.past, strict=True):
            io.bind_ortvalue_input(name, value)
        io.bind_output(lay.logits_name, "cpu")
        for name, value in zip(lay.present_names, seq.past, strict=True):
            if lay.shared_buffer:
                io.bind_ortvalue_output(name, value)  # written in place
            else:
                io.bind_output(name, "cpu")
        self.session.run_with_iobinding(io)
        outs = io.get_outputs()
        seq.logits = np.asarray(outs[0].numpy()[0, -1], dtype=np.float32)
        if not lay.shared_buffer:
            seq.past = list(outs[1:])
        seq.length += n


def _genai_shares_buffer(model_dir: Path) -> bool:
    """An onnxruntime-genai export declares its KV layout in genai_config.json."""
    path = model_dir / "genai_config.json"
    if not path.exists():
        return False
    search = json.loads(path.read_text()).get("search", {})
    return bool(search.get("past_present_share_buffer", False))
