"""Grammar masks: after a step has sampled (and fed every constraint its token), the next step's masks
are computed in worker threads while the model runs (llguidance releases the GIL), so grammar
masks cost little wall time. Masks are pure functions of a constraint's state, so when they are
computed never changes what is sampled. Unconstrained sequences skip all of it. Each sequence's mask
is a job of its own with a deadline (`mask_deadline_s` from its submission): the next step waits for
a mask that long at most, then fails that sequence alone (pop_failures) and samples the others; the
late job runs on in its thread, abandoned, and a fresh pool takes the next masks. A constraint whose
`failure()` (optional) reports a grammar's exhausted per-step fuel is failed the same way."""

from __future__ import annotations

import os
import time
from concurrent.futures import CancelledError, ThreadPoolExecutor

from service.engine.base import EngineError
from service.engine.core import EngineSequence, MaskJob
from service.engine.run_binding import RunBinding

# Threads computing grammar masks beside the forward pass (one job per sequence).
_MASK_THREADS = max(1, min(4, (os.cpu_count() or 2) // 2))
# How long a step waits for a mask not ready when it starts (it had the last decode's time to run beside the model)
# before its sequence sits the step out.
_MASK_GRACE_S = 0.002
# With no other sequence to step, how long a step waits for a late mask before returning empty-handed: the engine
# thread comes back soon to admit newcomers, which would otherwise wait for the slow mask.
_ALONE_MASK_WAIT_S = 0.01


class Masks(RunBinding):
    """Each constrained sequence's next mask, computed beside the forward pass and awaited before sampling."""

    mask_deadline_s: float
    _mask_pool: ThreadPoolExecutor | None  # started on the first constrained step

    def _submit_mask(self, seq: EngineSequence) -> None:
        if self._mask_pool is None:
            self._mask_pool = ThreadPoolExecutor(max_workers=_MASK_THREADS, thread_name_prefix="masks")
        assert seq.constraint is not None
        job = self._mask_pool.submit(seq.constraint.allowed_token_ids)
        seq.mask_job = MaskJob(job, time.monotonic(), self._mask_pool)

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

    def _wait_masks(
        self, waiting: list[tuple[str, EngineSequence]], grace_end: float
    ) -> list[tuple[str, EngineSequence]]:
        """Wait for the jobs until `grace_end` (or their deadlines, if sooner); the sequences whose masks are not
        ready then. A job that raised fails its own sequence."""
        pending: list[tuple[str, EngineSequence]] = []
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
