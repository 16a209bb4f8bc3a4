"""Group commit: every write of an engine step waits in the backlog while a commit is in flight, and the next
commit takes them all (one transaction for all runs), so the engine never waits for the database. Transient
store faults are retried, an outage past Settings.store_outage_seconds fails foreground runs, a write the
store refuses fails its own run only, and a run the commit finds no longer ours is dropped."""

from __future__ import annotations

import asyncio
import logging
import time

from sqlalchemy.ext.asyncio import AsyncEngine

from service import observability as metrics
from service.config import Settings
from service.model_runtime import ModelRuntime
from service.notify import Notifier
from service.runs.engine_worker import EngineWorker
from service.runs.state import ActiveRun
from service.store import event_log, recorder
from service.store.faults import backoff_seconds, is_transient
from service.store.recorder import RunWrite, StepOutcome
from service.store.token_facts import TokenChunks
from service.stream_builder import Ending

log = logging.getLogger(__name__)

# Steps that may wait for a slow database before the engine waits too (bounds memory).
MAX_BACKLOG_STEPS = 16


class _GaveUp(Exception):
    """A commit abandoned while shutting down; the log still holds everything committed."""


class GroupCommit(EngineWorker):
    def __init__(self, db: AsyncEngine, runtime: ModelRuntime, notifier: Notifier, settings: Settings) -> None:
        super().__init__(db, runtime, notifier, settings)
        # Group commit: steps wait in the backlog while a commit is in flight, and the next
        # commit takes them all, so the engine never waits for the database.
        self._inflight: asyncio.Future[None] | None = None
        self._backlog: dict[str, RunWrite] = {}
        self._backlog_steps = 0
        self._last_commit_started = 0.0  # time.monotonic() of the latest group commit's start
        # A run's first delta is in the backlog: commit it without waiting out the interval, which only
        # folds later deltas into one event and must not add to the time to first token.
        self._first_delta_queued = False
        self._commit_waiters: dict[int, list[asyncio.Future[bool]]] = {}  # id(RunWrite) -> waiters
        self._chunks = TokenChunks()  # each run's last token chunk: extended without reading it back

    def _enqueue(self, writes: list[RunWrite]) -> None:
        for write in writes:
            queued = self._backlog.get(write.response_id)
            if queued is None:
                self._backlog[write.response_id] = write
            else:
                queued.merge(write)
        self._backlog_steps += 1

    async def _drain(self, *, wait: bool) -> None:
        """Start committing the backlog once the commit in flight is done; with `wait`, return
        only when everything queued is committed. Never raises (see _commit)."""
        if self._inflight is not None:
            if not wait and not self._inflight.done():
                return
            await self._settle_inflight()
        if (
            not wait
            and not self._first_delta_queued
            and time.monotonic() < self._last_commit_started + self.settings.commit_interval_seconds
        ):
            return  # the next step's call starts it, with that step's tokens in the same group
        if self._backlog:
            self._last_commit_started = time.monotonic()
            self._first_delta_queued = False
            writes, self._backlog, self._backlog_steps = list(self._backlog.values()), {}, 0
            self._inflight = asyncio.ensure_future(self._commit(writes))
        if wait and self._inflight is not None:
            await self._settle_inflight()

    async def _settle_inflight(self) -> None:
        """Wait for the commit in flight. Shielded: a stop that cancels the waiting loop must not cut the
        commit off, or the backlog behind it (committed by stop) would land after a hole in the log; the
        commit stays `_inflight` until done, so stop's own drain waits for it first."""
        assert self._inflight is not None
        await asyncio.shield(self._inflight)
        self._inflight = None

    async def _commit(self, writes: list[RunWrite]) -> None:
        """Commit one group of writes; never raises.

        Transient store faults are waited out: the engine pauses once the backlog is full, so no
        token is ever sent before it is logged and memory stays bounded. Past
        `store_outage_seconds`, foreground runs are failed (their terminal events are logged when
        the store returns); background runs wait however long it takes. A write the database
        refuses for its content fails its own run only."""
        if not writes:
            return
        try:
            with metrics.GROUP_COMMIT.time():
                outcome = await self._commit_retrying(writes)
        except _GaveUp:
            # Not committed, so none of these runs' later writes may be either (a hole in the log):
            # they are lost to this worker, and whoever claims them regenerates the tokens.
            outcome = StepOutcome({}, {w.response_id for w in writes})
        except Exception:
            outcome = await self._commit_isolated(writes)
        self._resolve_waiters(writes, outcome.lost)
        for rid in outcome.lost:
            log.warning("run %s is no longer ours (lease lost, or its commit given up); dropping it", rid)
            self._backlog.pop(rid, None)
            await self._drop(rid)
        self._note_cancels(outcome.cancel_requested)
        kept = [w for w in writes if w.response_id not in outcome.lost]
        metrics.TOKENS.inc(metrics.token_count(w.facts for w in kept))
        # The JSON serialized for the log is what readers are handed: each event is serialized once.
        await self.notifier.publish(
            [w.response_id for w in kept],
            {w.response_id: [event_log.live(e) for e in w.encoded_events()] for w in kept},
        )

    async def _commit_retrying(self, writes: list[RunWrite]) -> StepOutcome:
        """commit_step, retried through transient faults; raises what retrying cannot fix."""
        pending = list(writes)
        outage_started: float | None = None
        attempt = 0
        while True:
            attempt_started = time.monotonic()
            try:
                outcome = await recorder.commit_step(
                    self.db, self.owner, pending, lease_seconds=self.settings.lease_seconds, chunks=self._chunks
                )
            except Exception as exc:
                if not is_transient(exc):
                    raise
                if self._stopping:
                    # Shutting down: what is not committed is regenerated by whoever claims the runs.
                    raise _GaveUp from exc
                metrics.STORE_RETRIES.inc()
                if outage_started is None:
                    outage_started = attempt_started  # a statement may have waited for a lock first
                    log.warning("store unavailable (%s); holding %d run(s) until it returns", exc, len(pending))
                await asyncio.sleep(backoff_seconds(attempt))
                attempt += 1
                if time.monotonic() - outage_started > self.settings.store_outage_seconds:
                    self._fail_foreground_runs()
                # The cut may have come after COMMIT reached the server: ask the log what landed,
                # rather than reading our own unique-key conflict as "someone else owns the run".
                try:
                    already = await recorder.landed(self.db, pending)
                except Exception as landed_exc:  # the store still away: all of them are tried again
                    level = logging.DEBUG if is_transient(landed_exc) else logging.WARNING
                    log.log(level, "could not ask the log which writes landed (%s)", landed_exc, exc_info=True)
                else:
                    pending = [w for w in pending if w.response_id not in already]
                if not pending:
                    outcome = StepOutcome({}, set())
                    break
                continue
            break
        if outage_started is not None:
            log.warning("store back after %.1fs", time.monotonic() - outage_started)
        return outcome

    async def _commit_isolated(self, writes: list[RunWrite]) -> StepOutcome:
        """The database refused the group: commit each run alone, and fail the one(s) it refuses."""
        cancels: dict[str, bool] = {}
        lost: set[str] = set()
        for write in writes:
            try:
                outcome = await self._commit_retrying([write])
            except _GaveUp:
                lost.add(write.response_id)
                continue
            except Exception as exc:
                log.exception("the store refused the events of run %s; failing it", write.response_id)
                lost.add(write.response_id)
                await self._drop(write.response_id)
                await self._fail_from_log(write.response_id, f"The run's output could not be stored: {exc}")
                continue
            cancels.update(outcome.cancel_requested)
            lost |= outcome.lost
        return StepOutcome(cancels, lost)

    def _fail_foreground_runs(self) -> None:
        """The store has been away too long for clients that are waiting: end their runs. The
        terminal events queue behind what is already waiting and land when the store returns."""
        for run in list(self.active.values()):
            if run.fact.background:
                continue
            self._forget(run.response_id)
            write = run.write()
            run.finish(
                write,
                "failed",
                {
                    "code": "store_unavailable",
                    "message": f"The event store was unreachable for more than "
                    f"{self.settings.store_outage_seconds:g}s, so the run was stopped.",
                },
            )
            self._enqueue([write])

    def _resolve_waiters(self, writes: list[RunWrite], lost: set[str]) -> None:
        for write in writes:
            if write.terminal:
                self.tool_steps.forget(write.response_id)
            for future in self._commit_waiters.pop(id(write), []):
                if not future.done():
                    future.set_result(write.response_id not in lost)

    def _note_cancels(self, cancel_requested: dict[str, bool]) -> None:
        """Flag owned runs whose cancel was requested; the loop ends them before its next step (a run in a
        tool call, when the call returns)."""
        for rid, cancel in cancel_requested.items():
            run = self.active.get(rid) or self._tool_runs.get(rid)
            if cancel and run is not None:
                run.cancel_requested = True
                self.wake()

    async def _commit_alone(self, run: ActiveRun, ending: Ending, error: dict[str, str] | None = None) -> None:
        write = run.write()
        run.finish(write, ending, error)
        self._enqueue([write])
        await self._drain(wait=True)

    async def _commit_and_wait(self, write: RunWrite) -> bool:
        """Queue a write with the next group commit; True once committed, False if the run was lost."""
        self._enqueue([write])
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._commit_waiters.setdefault(id(self._backlog[write.response_id]), []).append(future)
        self.wake()
        return await future
