"""The run supervisor: claims runs from the log, steps them through the engine together,
and commits each step of every run in one transaction (group commit) before anyone sees it.

A run is rebuilt from the log when it is claimed (after a crash, or on another replica):
the request fact gives the prompt and sampling, the token facts give what was sampled,
and replaying those tokens through a fresh parser and StreamBuilder regenerates exactly
the events already logged, so generation continues with the next sequence number.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service import observability as metrics
from service.config import Settings
from service.engine.admission import limit_for_engine
from service.engine.base import EngineError, LogitsConstraint, SamplingParams, TokenOutput
from service.model_runtime import ModelRuntime
from service.notify import Notifier
from service.projection import project
from service.prompting.base import MalformedOutput, PartialTurn, next_turn_prefix
from service.protocol import TERMINAL_EVENT_TYPES
from service.run_state import ActiveRun, prompt_request_from_fact, replay_run
from service.store import event_log, leases, recorder
from service.store.db import checkpoint_when_idle, write_transaction
from service.store.faults import backoff_seconds, is_transient
from service.store.leases import ClaimedRun
from service.store.recorder import RunWrite, StepOutcome
from service.store.token_facts import TokenChunks
from service.stream_builder import Ending, StreamBuilder
from service.tool_steps import RunLost, ToolSteps, tool_facts

log = logging.getLogger(__name__)
T = TypeVar("T")

# Steps that may wait for a slow database before the engine waits too (bounds memory).
MAX_BACKLOG_STEPS = 16
# Engine steps queued ahead of the loop: one computing while the loop handles the previous one's
# tokens, and one waiting, so the engine never waits for the loop to wake up.
STEPS_AHEAD = 2
# Tokens an idle engine prefills per call of warm (readying the prefix cache for a conversation's
# next turn): a newcomer waits for at most one such call before its own prefill starts.
WARM_CHUNK_TOKENS = 64
# With Settings.warm_while_decoding, a conversation already continued once (its prompt holds a model turn) is
# taken as likely to be continued again at once (a tool loop, a client that answers without pause): its next
# turn is rendered every this many tokens as the turn decodes and prefilled beside the decoding, at most
# WARM_STEP_TOKENS an engine step, so that the next turn prefills only what it adds. Other runs' next turns
# are warmed only by an idle engine.
WARM_EVERY_TOKENS = 16
WARM_STEP_TOKENS = 16
# Finished conversations whose next turn an idle engine prefills (the most recent ones).
WARM_QUEUE = 4
# How often an idle worker truncates SQLite's WAL (see store.db.checkpoint_when_idle).
CHECKPOINT_INTERVAL_SECONDS = 30.0
# What one engine step yields: each sampled token, and the runs whose deferred prefill failed in it.
_StepResult = tuple[dict[str, TokenOutput], dict[str, EngineError]]


_Logs = dict[str, tuple[list[event_log.StoredFact], list[event_log.StoredEvent]]]


def _payloads(logs: _Logs) -> dict[str, tuple[list[event_log.StoredFact], list[dict[str, Any]]]]:
    """Each run's facts, and its events as the dicts the stream builder replays."""
    return {rid: (facts, [e.payload() for e in stored]) for rid, (facts, stored) in logs.items()}


def _after(logged: list[dict[str, Any]]) -> int:
    """The sequence number after a run's logged events (past any hole an older version left)."""
    return logged[-1]["sequence_number"] + 1 if logged else 0


class _GaveUp(Exception):
    """A commit abandoned while shutting down; the log still holds everything committed."""


# An add waiting for the engine thread: the call, the first step that may run it, the future it settles.
_WaitingAdd = tuple[Callable[[], None], int, asyncio.Future[None]]


class _PendingAdds:
    """engine.add_sequence calls waiting for the engine thread, in arrival order. The loop puts them; the
    engine thread takes them at the start of a step (those that step may serve) or in a job of their own;
    each call runs once, and its outcome settles its future on the loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: list[_WaitingAdd] = []

    def put(self, add: Callable[[], None], *, first_step: int, done: asyncio.Future[None]) -> None:
        with self._lock:
            self._waiting.append((add, first_step, done))

    def take(self, step: int | None) -> None:
        """Run (in the engine thread) the adds that step `step` may serve; all of them for None."""
        now: list[_WaitingAdd] = []
        later: list[_WaitingAdd] = []
        with self._lock:
            for waiting in self._waiting:
                (now if step is None or waiting[1] <= step else later).append(waiting)
            self._waiting = later
        for add, _, done in now:
            try:
                add()
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
                done.get_loop().call_soon_threadsafe(_settle, done, exc)
            else:
                done.get_loop().call_soon_threadsafe(_settle, done, None)


def _settle(future: asyncio.Future[None], exc: BaseException | None) -> None:
    if future.done():  # its waiter was cancelled (shutdown)
        return
    if exc is None:
        future.set_result(None)
    else:
        future.set_exception(exc)


class RunSupervisor:
    def __init__(self, db: AsyncEngine, runtime: ModelRuntime, notifier: Notifier, settings: Settings) -> None:
        self.db = db
        self.runtime = runtime
        self.notifier = notifier
        self.settings = settings
        self.owner = settings.worker_id
        self.active: dict[str, ActiveRun] = {}
        self._wake = asyncio.Event()
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        # Group commit: steps wait in the backlog while a commit is in flight, and the next
        # commit takes them all, so the engine never waits for the database.
        self._inflight: asyncio.Future[None] | None = None
        self._backlog: dict[str, RunWrite] = {}
        self._backlog_steps = 0
        self._last_commit_started = 0.0  # time.monotonic() of the latest group commit's start
        # A run's first delta is in the backlog: commit it without waiting out the interval, which only
        # folds later deltas into one event and must not add to the time to first token.
        self._first_delta_queued = False
        # The engine is not thread-safe; one worker thread runs every engine call in order.
        self._engine_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        # Engine steps submitted ahead of the loop, with their index; a run that left the engine when
        # `n` steps had been submitted ignores the outputs of steps < n (they belong to its old self,
        # should the same run be claimed again).
        self._ahead: collections.deque[tuple[int, asyncio.Future[_StepResult]]] = collections.deque()
        self._steps_submitted = 0
        self._left_at: dict[str, int] = {}
        self._adds = _PendingAdds()  # newcomers for the engine thread's next step (see _add_to_engine)
        # Finished conversations' next-turn prompts, rendered and prefilled by an idle engine (_warm_some).
        self._to_warm: collections.deque[Callable[[], list[int]]] = collections.deque(maxlen=WARM_QUEUE)
        # Continued conversations' next turns, prefilled beside decoding runs too (_warm_beside).
        self._warm_now: collections.deque[Callable[[], list[int]]] = collections.deque(maxlen=WARM_QUEUE)
        self._warming_beside = False  # the engine has such warming left (engine thread only)
        self.clock = metrics.RunClock()  # time to first token, inter-token latency
        # Admission by memory: the rest wait in the durable queue (the log).
        self.max_active = limit_for_engine(runtime.engine, settings.kv_cache_budget_bytes, settings.max_active_runs)
        # The agent loop: runs out of the engine while a server-side tool call of theirs is executed.
        self.tool_steps = ToolSteps(settings, runtime.chat_format)
        self._tool_runs: dict[str, ActiveRun] = {}
        self._tool_tasks: set[asyncio.Task[None]] = set()
        self._commit_waiters: dict[int, list[asyncio.Future[bool]]] = {}  # id(RunWrite) -> waiters
        self._chunks = TokenChunks()  # each run's last token chunk: extended without reading it back
        self._admission_failing = False  # the last claim met a store outage (logged once, not per retry)
        self._admitting: set[str] = set()  # runs the admission under way has claimed (see stop)

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        await recorder.delete_finished_unstored(self.db)  # store=false responses whose client is gone
        self._tasks = [
            asyncio.create_task(self._loop(), name="run-loop"),
            asyncio.create_task(self._heartbeat(), name="run-heartbeat"),
        ]

    def alive(self) -> bool:
        """The run loop and the lease heartbeat are running (readiness)."""
        return bool(self._tasks) and not self._stopping and all(not task.done() for task in self._tasks)

    async def stop(self) -> None:
        """Stop stepping and hand owned runs back so another worker continues them at once."""
        if self._stopping:
            return
        self._stopping = True
        self._wake.set()
        in_tool_calls = list(self._tool_runs)  # handed back too: whoever claims them retries the call
        # A commit given up below drops its runs from `active`; runs claimed by an admission that stopping cuts
        # short are ours too, active or not yet.
        admitting = [rid for rid in self._admitting if rid not in self.active]
        owned = [*self.active, *in_tool_calls, *admitting]
        for task in [*self._tasks, *self._tool_tasks]:
            task.cancel()
        for task in [*self._tasks, *self._tool_tasks]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        with contextlib.suppress(Exception):
            await self._drain(wait=True)
        while self._ahead:  # steps computed ahead: their tokens are regenerated by whoever claims the runs
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._ahead.popleft()[1]
        if owned:
            with contextlib.suppress(Exception):
                await recorder.release(self.db, self.owner, owned)
        for response_id in [*self.active, *admitting]:
            with contextlib.suppress(Exception):
                await self._in_engine(self.runtime.engine.remove_sequence, response_id)
        self.active.clear()
        with contextlib.suppress(Exception):
            await self.tool_steps.connector.close()  # held MCP sessions
        self._engine_thread.shutdown(wait=True)

    def wake(self) -> None:
        self._wake.set()

    async def _in_engine(self, function: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._engine_thread, function, *args)

    # -- the loop --------------------------------------------------------------------------
    async def _loop(self) -> None:
        next_claim = 0.0
        next_checkpoint = time.monotonic() + CHECKPOINT_INTERVAL_SECONDS
        while not self._stopping:
            try:
                # Look for work when woken (new run, cancel) or every claim interval; not every step.
                if self._wake.is_set() or time.monotonic() >= next_claim:
                    self._wake.clear()
                    await self._admit_unless_store_down()
                    next_claim = time.monotonic() + self.settings.claim_interval_seconds
                if not self.active:
                    await self._drain(wait=True)
                    if await self._in_engine(self._warm_some):
                        continue  # more to warm: first see (at the top) whether a newcomer is waiting
                    if time.monotonic() >= next_checkpoint:
                        next_checkpoint = time.monotonic() + CHECKPOINT_INTERVAL_SECONDS
                        await checkpoint_when_idle(self.db)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), self.settings.claim_interval_seconds)
                    continue
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("run loop iteration failed; retrying")
                await asyncio.sleep(0.5)

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

    async def _admit_unless_store_down(self) -> None:
        """Admit runs; an outage only postpones admission, so the loop goes on stepping the active runs
        and their group commits wait it out (and fail foreground runs past the limit) as they do for any
        outage, whichever statement met it first."""
        try:
            await self._admit()
        except Exception as exc:
            if not is_transient(exc):
                raise
            if not self._admission_failing:
                log.warning("store unavailable while admitting runs (%s); admission waits for it", exc)
            self._admission_failing = True
            return
        if self._admission_failing:
            log.info("admission resumed")
        self._admission_failing = False

    async def _admit(self) -> None:
        await self._drain(wait=True)

        room, lease = self.max_active - len(self.active), self.settings.lease_seconds

        async def claim(connection: AsyncConnection) -> tuple[list[ClaimedRun], _Logs]:  # in the SQLite writer's thread
            claimed = await leases.claim(connection, self.owner, lease_seconds=lease, limit=100, cancelled_only=True)
            if room > 0:
                claimed += await leases.claim(connection, self.owner, lease_seconds=lease, limit=room)
            # Their logs in the same round trip (a newcomer's is its request and one event).
            return claimed, await event_log.read_logs(connection, [c.response_id for c in claimed])

        # Each run goes into the engine as soon as it is rebuilt, without waiting for its add: an add waits for
        # the engine thread's next step, so one by one a burst of N newcomers would wait N steps before the
        # last one's prefill could start.
        adding: list[tuple[ActiveRun, asyncio.Future[None]]] = []
        claims, stored_logs = await write_transaction(self.db, claim)
        self._admitting = {c.response_id for c in claims}  # owned, not yet active: stop() releases them too
        logs = _payloads(stored_logs)
        for claimed in claims:
            try:
                run = await self._resume(claimed, *logs[claimed.response_id])
            except Exception as exc:
                log.exception("could not start run %s", claimed.response_id)
                await self._fail_unstarted(claimed.response_id, f"The run could not be started: {exc}")
                continue
            if run is not None:
                adding += await self._start_adds([run], self._commit_alone)
        failed = await self._finish_adds(adding, self._commit_alone)
        self._admitting = set()
        for run, error in failed:
            log.error("could not start run %s", run.response_id, exc_info=error)
            await self._fail_unstarted(run.response_id, f"The run could not be started: {error}")
        await self._drain(wait=False)  # the started runs' first events: one commit for all, beside the next step

    async def _read_log(self, response_id: str) -> tuple[list[event_log.StoredFact], list[dict[str, Any]]]:
        async with self.db.connect() as connection:
            return _payloads(await event_log.read_logs(connection, [response_id]))[response_id]

    async def _resume(
        self, claimed: ClaimedRun, facts: list[event_log.StoredFact], logged: list[dict[str, Any]]
    ) -> ActiveRun | None:
        """Rebuild a claimed run from its log (read after the claim); returns it when it goes into the engine
        (the caller puts it there), None when it ended here or waits for a tool call."""
        rid = claimed.response_id
        if rid in self.active or rid in self._tool_runs:
            return None  # ours already: its lease lapsed while the store was away, and the claim renewed it
        if claimed.claims > 1:
            metrics.LEASE_TAKEOVERS.inc()
        request_facts = [f.data for f in facts if f.kind == "request"]
        if not request_facts or not logged:
            return None  # deleted meanwhile
        fact = request_facts[0]
        token_facts = [f.data for f in facts if f.kind == "tokens"]
        cancelled = claimed.cancel_requested or any(f.kind == "cancel_requested" for f in facts)

        constraint = self.runtime.new_constraint(prompt_request_from_fact(fact), fact.get("constraints"))
        run = replay_run(
            rid,
            fact,
            token_facts,
            logged,
            self.runtime.chat_format,
            constraint,
            tool_facts=tool_facts(facts),
            next_constraint=self.tool_steps.constraint_factory(self.runtime.new_constraint, fact),
            result_tokens=self.tool_steps.result_tokens,
        )

        if cancelled or (not claimed.background and claimed.claims > 1):
            # A foreground run whose worker died lost its client with it: record it as cancelled.
            await self._commit_alone(run, "cancelled")
            return None
        if run.pending:
            write = run.write()
            run.record(write, [])
            self._enqueue([write])  # committed with the other claimed runs' first events (see _admit)
        if run.builder.pending_call is not None:  # its call has no logged result yet: (re)run it
            self._start_tool_call(run)
            return None
        return run

    async def _into_engine(self, run: ActiveRun, end: Callable[..., Awaitable[None]]) -> None:
        """Put a run (back) into the engine at its current segment (service/tool_state.py); `end` ends it
        (from the run loop, `_commit_alone`; from a tool call's task, `_end_queued`)."""
        for _, exc in await self._finish_adds(await self._start_adds([run], end), end):
            raise exc

    async def _start_adds(
        self, runs: list[ActiveRun], end: Callable[..., Awaitable[None]]
    ) -> list[tuple[ActiveRun, asyncio.Future[None]]]:
        """Start putting runs into the engine (see _finish_adds); a run with no token left to generate is
        ended here."""
        adding: list[tuple[ActiveRun, asyncio.Future[None]]] = []
        for run in runs:
            params = self._sampling_params(run)
            assert run.segment is not None
            if params.max_new_tokens <= len(run.segment.tokens):
                await end(run, "length")
                continue
            # Quick: the engine only validates and registers it; its prefill happens in the next steps,
            # between decode runs (the first token's wait, prefill included, is timed from here).
            add = self._add_to_engine(run.response_id, run.segment.prompt, params, run.constraint, run.segment.tokens)
            adding.append((run, asyncio.ensure_future(add)))
        return adding

    async def _finish_adds(
        self, adding: list[tuple[ActiveRun, asyncio.Future[None]]], end: Callable[..., Awaitable[None]]
    ) -> list[tuple[ActiveRun, Exception]]:
        """Wait for the adds _start_adds began: the added runs become active, an EngineError is recorded as its
        run's failure (by `end`); returns the runs whose add raised anything else."""
        outcomes = await asyncio.gather(*(add for _, add in adding), return_exceptions=True)
        failed: list[tuple[ActiveRun, Exception]] = []
        for (run, _), outcome in zip(adding, outcomes, strict=True):
            if isinstance(outcome, EngineError):
                assert run.segment is not None
                too_long = len(run.segment.prompt) + len(run.segment.tokens) >= self.runtime.engine.max_context
                code = "context_length_exceeded" if too_long else "model_error"
                await end(run, "failed", {"code": code, "message": str(outcome)})
            elif isinstance(outcome, Exception):
                failed.append((run, outcome))
            elif isinstance(outcome, BaseException):
                raise outcome  # cancelled (shutdown)
            else:
                self.active[run.response_id] = run
                self.clock.started(run.response_id)
        return failed

    def _sampling_params(self, run: ActiveRun) -> SamplingParams:
        fact, segment = run.fact, run.segment
        assert segment is not None
        sampling = fact["sampling"]
        return SamplingParams(
            # The engine counts the replayed tokens too; earlier segments' tokens count against the cap.
            max_new_tokens=sampling["max_new_tokens"] - segment.generated_before,
            temperature=sampling["temperature"],
            top_p=sampling["top_p"],
            seed=sampling["seed"],
            top_logprobs=sampling["top_logprobs"],
            logprobs=bool(fact.get("logprobs")),  # what the response's events carry (see _logprob_entry)
            frequency_penalty=sampling.get("frequency_penalty", 0.0),
            presence_penalty=sampling.get("presence_penalty", 0.0),
            stop_token_ids=self.runtime.chat_format.stop_token_ids(),
        )

    # -- the agent loop (service/tool_steps.py) -------------------------------------------------
    def _start_tool_call(self, run: ActiveRun) -> None:
        self._tool_runs[run.response_id] = run
        task = asyncio.create_task(self._tool_call(run), name=f"tool-call-{run.response_id}")
        self._tool_tasks.add(task)
        task.add_done_callback(self._tool_tasks.discard)

    async def _tool_call(self, run: ActiveRun) -> None:
        rid = run.response_id
        try:
            await self.tool_steps.run_call(run, self._commit_and_wait)
            run.parser = self.runtime.chat_format.new_parser()
            assert run.segment is not None
            run.constraint = self.tool_steps.constraint_factory(self.runtime.new_constraint, run.fact)(
                run.segment.calls_made
            )
            self._tool_runs.pop(rid, None)
            if run.cancel_requested:
                await self._end_queued(run, "cancelled")
            else:
                await self._into_engine(run, self._end_queued)
        except (RunLost, asyncio.CancelledError):
            self._tool_runs.pop(rid, None)
            raise
        except Exception as exc:
            log.exception("tool call of run %s failed", rid)
            self._tool_runs.pop(rid, None)
            with contextlib.suppress(RunLost):
                await self._end_queued(run, "failed", {"code": "server_error", "message": f"tool call failed: {exc}"})
        self.wake()

    async def _end_queued(self, run: ActiveRun, ending: Ending, error: dict[str, str] | None = None) -> None:
        """End a run from outside the run loop (a tool call's task): queue the terminal events and wait."""
        write = run.write()
        run.finish(write, ending, error)
        if not await self._commit_and_wait(write):
            raise RunLost(run.response_id)

    async def _commit_and_wait(self, write: RunWrite) -> bool:
        """Queue a write with the next group commit; True once committed, False if the run was lost."""
        self._enqueue([write])
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._commit_waiters.setdefault(id(self._backlog[write.response_id]), []).append(future)
        self.wake()
        return await future

    async def _step(self) -> None:
        cancelled = [r for r in self.active.values() if r.cancel_requested]
        if cancelled:
            await self._drain(wait=True)
            for run in cancelled:
                await self._drop(run.response_id)
                await self._commit_alone(run, "cancelled")
        if not self.active:
            return
        # Pipelining: the engine runs up to STEPS_AHEAD steps ahead of this loop, back to back in its
        # thread, while the loop turns earlier steps' tokens into events, commits them and fans them out.
        # Clients only ever read committed events, so write-before-send holds; a run that leaves (lost,
        # cancelled, failed) meanwhile has its extra tokens discarded.
        self._submit_steps()
        index, step = self._ahead.popleft()
        await self._drain(wait=self._backlog_steps >= MAX_BACKLOG_STEPS)  # overlaps the engine step
        try:
            outputs, failures = await step
        except Exception as exc:
            log.exception("engine step failed")
            for run in list(self.active.values()):
                await self._drop(run.response_id)
                await self._commit_alone(run, "failed", {"code": "server_error", "message": f"engine error: {exc}"})
            return
        self._submit_steps()  # before this step's events are built: the engine does not wait for them

        def current(rid: str) -> bool:  # still ours, and not a step computed for an earlier incarnation
            return rid in self.active and self._left_at.get(rid, -1) <= index

        advanced = [self._advance(self.active[rid], output) for rid, output in outputs.items() if current(rid)]
        writes = [write for write in advanced if write is not None]
        writes += [self._prefill_failed(self.active[rid], exc) for rid, exc in failures.items() if current(rid)]
        self._left_at = {rid: at for rid, at in self._left_at.items() if at > index + 1}
        self._enqueue(writes)

    def _submit_steps(self) -> None:
        """Queue engine steps until STEPS_AHEAD are in flight (the engine thread runs them in order)."""
        while self.active and len(self._ahead) < STEPS_AHEAD:
            index = self._steps_submitted
            self._ahead.append((index, asyncio.ensure_future(self._in_engine(self._engine_step, index))))
            self._steps_submitted += 1

    def _engine_step(self, index: int) -> _StepResult:
        """One engine step and the runs whose prefill failed in it (in the engine thread); newcomers waiting
        for this step join it first."""
        self._adds.take(index)
        engine = self.runtime.engine
        outputs = metrics.timed(metrics.ENGINE_STEP, engine.step)()
        failures = engine.pop_failures()
        if self._warm_now or self._warming_beside:
            self._warming_beside = self._warm_beside(WARM_STEP_TOKENS)
        return outputs, failures

    async def _add_to_engine(
        self,
        rid: str,
        prompt: list[int],
        params: SamplingParams,
        constraint: LogitsConstraint | None,
        tokens: list[int],
    ) -> None:
        """engine.add_sequence, in the engine thread, at the start of the first engine step already queued
        there that may yield the run's tokens, or on its own if none does. Queued behind those steps, a
        newcomer would wait for all of them (STEPS_AHEAD) before its prefill could start. A run that left
        the engine when n steps had been submitted may only join a step >= n: the loop ignores its outputs
        of earlier steps (see _left_at)."""
        loop = asyncio.get_running_loop()
        added: asyncio.Future[None] = loop.create_future()
        self._adds.put(
            functools.partial(self.runtime.engine.add_sequence, rid, prompt, params, constraint, tokens),
            first_step=self._left_at.get(rid, 0),
            done=added,
        )
        loop.run_in_executor(self._engine_thread, self._adds.take, None)  # taken here if no queued step did
        await added

    def _prefill_failed(self, run: ActiveRun, exc: EngineError) -> RunWrite:
        """End a run whose prefill failed in the engine step (the engine has dropped it already)."""
        self._forget(run.response_id, in_engine=False)
        write = run.write()
        run.finish(write, "failed", {"code": "model_error", "message": str(exc)})
        return write

    def _advance(self, run: ActiveRun, output: TokenOutput) -> RunWrite | None:
        """The run's write for one engine step, or None when the step joined the group its earlier steps left in
        the backlog: steps committed together have their deltas folded into one event per content (fewer rows,
        frames and parses per token when the engine outruns the commit interval; replay folds the same groups)."""
        write = run.write()
        queued = self._backlog.get(run.response_id)
        group = queued if queued is not None and queued.group_start is not None and not write.events else None
        if run.segment is not None:
            run.segment.tokens.append(output.token_id)
        logprobs = [self._logprob_entry(output)] if run.fact.get("logprobs") else None
        token_fact = {"ids": [output.token_id], **({"logprobs": logprobs} if logprobs else {})}
        run.token_facts += 1
        run.generated += 1
        self.clock.token(run.response_id)
        try:
            chunks = run.parser.feed(output.token_id)
        except MalformedOutput as exc:
            write.facts.append(("tokens", token_fact))
            self._forget(run.response_id)
            run.finish(write, "failed", {"code": "malformed_output", "message": str(exc)})
            return write
        new_events = run.builder.feed(chunks, logprobs=logprobs)
        if not run.delta_queued and any(e["type"].endswith(".delta") for e in new_events):
            run.delta_queued = self._first_delta_queued = True
        if group is not None:
            run.record_joined(group, token_fact, new_events)
        else:
            write.facts.append(("tokens", token_fact))
            write.group_start = len(write.events)
            run.record(write, new_events)
        if output.finish_reason is None:
            if run.generated % WARM_EVERY_TOKENS == 0 and self._continues_conversation(run):
                self._warm_partial_turn(run)
            return None if group is not None else write
        write.group_start = None  # what follows (the end, a tool call) closes the group
        self._forget(run.response_id, in_engine=False)
        if output.finish_reason == "stop" and run.builder.pending_call is not None:
            self._start_tool_call(run)  # a server-side call: executed, then the run continues
        else:
            run.finish(write, output.finish_reason)
            self._warm_next_turn(run)
        return write

    def _warm_next_turn(self, run: ActiveRun) -> None:
        """Have the engine prefill the conversation as its next turn will render it, once idle: a client
        that continues it (previous_response_id, a conversation, a tool's output) then waits only for the
        prefill of what it adds. Rendering waits for the engine thread's idle time too."""
        if getattr(self.runtime.engine, "prefix_cache", None) is None:
            return
        if run.projected.get("status") not in ("completed", "incomplete"):
            return
        outputs = list(run.projected.get("output") or [])
        request = prompt_request_from_fact(run.fact)
        render = functools.partial(next_turn_prefix, self.runtime.chat_format, request, outputs)
        (self._warm_now if self._continues_conversation(run) else self._to_warm).append(render)

    def _continues_conversation(self, run: ActiveRun) -> bool:
        """Whether the run's next turn is warmed as it decodes: with warm_while_decoding, when its prompt holds an
        earlier turn of the model (an answer, a call, a call's output)."""
        if not self.settings.warm_while_decoding or getattr(self.runtime.engine, "prefix_cache", None) is None:
            return False
        return any(
            item.get("type", "message") != "message" or item.get("role") == "assistant"
            for item in run.fact["prompt_items"]
        )

    def _warm_partial_turn(self, run: ActiveRun) -> None:
        """Queue the next turn's start as far as the run's output so far fixes it (warmed beside the decoding).
        Not while reasoning: the next turn drops it once an answer follows."""
        outputs = list(run.projected.get("output") or [])
        if not outputs or outputs[-1].get("type") == "reasoning":
            return
        if run.partial_turn is None:
            run.partial_turn = PartialTurn(self.runtime.chat_format, prompt_request_from_fact(run.fact))
        snapshot = [*outputs[:-1], copy.deepcopy(outputs[-1])]  # only the last item still changes
        self._warm_now.append(functools.partial(run.partial_turn.prefix, snapshot))

    def _newcomer_waiting(self) -> bool:
        """In the engine thread: whether a run was created (or a cancel asked) since the loop last admitted. Warming
        then waits: a run of warming started now would delay the newcomer's prefill by a whole run (tens of ms at
        batch 1, mostly the pass over the weights), while the same tokens cost little more inside its own run
        (the prefix it shares with the warming is taken from the rows already warmed). The event's flag is a
        plain attribute, safe to read from this thread."""
        return self._wake.is_set()

    def _render_queued(self, renders: collections.deque[Callable[[], list[int]]]) -> None:
        """In the engine thread: render the queued next turns, handing them to the engine to warm."""
        while renders:
            render = renders.popleft()
            try:
                self.runtime.engine.warm_prefix(render())
            except Exception:  # a prompt the format cannot render: nothing to warm, nothing lost
                log.debug("could not render a run's next turn", exc_info=True)

    def _warm_some(self) -> bool:
        """In the engine thread while no run is active: render the queued next turns, then prefill a chunk
        of them (engine.warm); True while work is left."""
        if self._newcomer_waiting():
            return True
        self._render_queued(self._warm_now)
        self._render_queued(self._to_warm)
        return self.runtime.engine.warm(WARM_CHUNK_TOKENS)

    def _warm_beside(self, max_tokens: int) -> bool:
        """In the engine thread, after a step with runs active: the continued conversations' warming (others'
        waits for an idle engine); True while work is left. A failure drops the warming, never the step.
        The warming sequence takes a KV slot of its own, so it waits while the active runs fill the admission
        budget (a newcomer's add_sequence ends it, so it never holds a slot a run was admitted to)."""
        if len(self.runtime.engine.active_sequence_ids()) >= self.max_active or self._newcomer_waiting():
            return True
        self._render_queued(self._warm_now)
        try:
            return self.runtime.engine.warm(max_tokens)
        except Exception:
            log.warning("warming a next turn beside the decoding failed; dropped", exc_info=True)
            return False

    def _logprob_entry(self, output: TokenOutput) -> dict[str, Any]:
        assert output.logprob is not None  # the run's SamplingParams ask for it (_sampling_params)

        def entry(token_id: int, logprob: float) -> dict[str, Any]:
            text = self.runtime.chat_format.token_text(token_id)
            return {"token": text, "bytes": list(text.encode()), "logprob": logprob}

        return {
            **entry(output.token_id, output.logprob),
            "top_logprobs": [entry(t, lp) for t, lp in output.top_logprobs],
        }

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
                with contextlib.suppress(Exception):
                    already = await recorder.landed(self.db, pending)
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
            if run.fact.get("request", {}).get("background"):
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

    async def _fail_from_log(self, response_id: str, message: str) -> None:
        """End a run with `response.failed` right after what its log holds."""
        try:
            facts, logged = await self._read_log(response_id)
            fact = next(f.data for f in facts if f.kind == "request")
            if not logged or logged[-1]["type"] in TERMINAL_EVENT_TYPES:
                return
            builder = StreamBuilder(fact["response"], next_sequence_number=_after(logged))
            run = ActiveRun(response_id, fact, builder, self.runtime.chat_format.new_parser(), project(logged), 0)
            write = run.write()
            run.finish(write, "failed", {"code": "server_error", "message": message})
            await self._commit_retrying([write])
        except Exception:
            log.exception("could not record the failure of run %s", response_id)
            return
        await self.notifier.publish([response_id], {response_id: [event_log.live(e) for e in write.encoded_events()]})

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

    async def _fail_unstarted(self, response_id: str, message: str) -> None:
        with contextlib.suppress(Exception):
            facts, logged = await self._read_log(response_id)
            fact = next(f.data for f in facts if f.kind == "request")
            # Its tokens could not be replayed: end it after what is logged, with no new output.
            builder = StreamBuilder(fact["response"], next_sequence_number=_after(logged))
            run = ActiveRun(response_id, fact, builder, self.runtime.chat_format.new_parser(), project(logged), 0)
            await self._commit_alone(run, "failed", {"code": "server_error", "message": message})

    def _forget(self, response_id: str, *, in_engine: bool = True) -> None:
        self.active.pop(response_id, None)
        self._left_at[response_id] = self._steps_submitted
        self.clock.ended(response_id)
        if in_engine:
            self._engine_thread.submit(self.runtime.engine.remove_sequence, response_id)

    async def _drop(self, response_id: str) -> None:
        self.active.pop(response_id, None)
        self._left_at[response_id] = self._steps_submitted
        self.clock.ended(response_id)
        await self._in_engine(self.runtime.engine.remove_sequence, response_id)

    async def _heartbeat(self) -> None:
        """Renew leases between commits (long steps) and notice cancels and lost runs."""
        while not self._stopping:
            await asyncio.sleep(self.settings.lease_seconds / 3)
            if not self.active and not self._tool_runs:
                continue
            with contextlib.suppress(Exception):
                async with self.db.begin() as connection:
                    owned = await leases.fence(
                        connection,
                        self.owner,
                        [*self.active, *self._tool_runs],
                        lease_seconds=self.settings.lease_seconds,
                    )
                self._note_cancels(owned)
