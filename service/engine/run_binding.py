"""Running the model over sequences: a prefill or replay run at batch 1 in a sequence's slot, a decode run over a
run of consecutive slots at batch n (right-padded attention mask; GQA reads each row's own length from it), and
the IOBinding cache that lets a one-token run bind only its inputs. With the standard Concat layout (Optimum
exports) each sequence's cache stays as ORT-owned OrtValues passed from present to past, never through numpy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from service.engine.core import EngineCore, EngineSequence

# Decode bindings kept (one per run of slots a decode step takes: batch sizes, chunks past max_batch, slots of
# sequences decoded alone); past it they are dropped and bound again as needed.
_BOUND_RUNS = 64


@dataclass
class BoundRun:
    """An IOBinding with a run of the pool's slots bound in place (as of the pool's `generation`) and the logits
    buffer its runs write (see RunBinding._bound_run)."""

    generation: int
    io: ort.IOBinding
    logits: np.ndarray


def float_logits_width(session: ort.InferenceSession, name: str) -> int | None:
    """The vocabulary axis of a float32 logits output, when the graph states it (else None: bound per run)."""
    for output in session.get_outputs():
        if output.name == name and output.type == "tensor(float)" and output.shape:
            width = output.shape[-1]
            return width if isinstance(width, int) and width > 0 else None
    return None


class RunBinding(EngineCore):
    """Model runs over the KV slots: prefill and replay runs at batch 1, decode runs over consecutive slots."""

    session: ort.InferenceSession
    # Decode runs' bindings, by (first slot, rows): the pool's tensors stay bound between runs (see _bound_run).
    _bound: dict[tuple[int, int], BoundRun]
    _logits_width: int | None  # float32 logits' vocabulary axis, where the graph states it (else bound per run)

    def _bound_run(self, first: int, rows: int) -> BoundRun | None:
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
        bound = self._bound[(first, rows)] = BoundRun(pool.generation, io, logits)
        return bound

    def _decode_batch(self, batch: list[tuple[EngineSequence, int]]) -> None:
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

    def _forward(self, seq: EngineSequence, ids: Sequence[int]) -> None:
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
