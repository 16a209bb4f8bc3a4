"""The engine worker: the single thread every engine call runs in (the engine is not thread-safe), the steps
queued there ahead of the loop (pipelining, STEPS_AHEAD), newcomers' adds joining the first step that may
serve them (_PendingAdds), and a run's leaving the engine (_left_at: it ignores the outputs of steps
submitted before it left)."""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from service import observability as metrics
from service.config import Settings
from service.engine.base import EngineError, LogitsConstraint, SamplingParams, TokenOutput
from service.model_runtime import ModelRuntime
from service.notify import Notifier
from service.runs.state import ActiveRun
from service.runs.warming import WARM_STEP_TOKENS, Warming

log = logging.getLogger(__name__)
T = TypeVar("T")

# Engine steps queued ahead of the loop: one computing while the loop handles the previous one's
# tokens, and one waiting, so the engine never waits for the loop to wake up.
STEPS_AHEAD = 2
# What one engine step yields: each sampled token, and the runs whose deferred prefill failed in it.
_StepResult = tuple[dict[str, TokenOutput], dict[str, EngineError]]
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


def _log_failed_removal(response_id: str, removal: Future[None]) -> None:
    """A removal _forget does not await: its failure is logged (in the engine thread)."""
    if not removal.cancelled() and (exc := removal.exception()) is not None:
        log.error("could not remove run %s from the engine", response_id, exc_info=exc)


class EngineWorker(Warming):
    def __init__(self, db: AsyncEngine, runtime: ModelRuntime, notifier: Notifier, settings: Settings) -> None:
        super().__init__(db, runtime, notifier, settings)
        # The engine is not thread-safe; one worker thread runs every engine call in order.
        self._engine_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        # Engine steps submitted ahead of the loop, with their index; a run that left the engine when
        # `n` steps had been submitted ignores the outputs of steps < n (they belong to its old self,
        # should the same run be claimed again).
        self._ahead: collections.deque[tuple[int, asyncio.Future[_StepResult]]] = collections.deque()
        self._steps_submitted = 0
        self._left_at: dict[str, int] = {}
        self._adds = _PendingAdds()  # newcomers for the engine thread's next step (see _add_to_engine)

    async def _in_engine(self, function: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._engine_thread, function, *args)

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

    async def _into_engine(self, run: ActiveRun, end: Callable[..., Awaitable[None]]) -> None:
        """Put a run (back) into the engine at its current segment (service/agent/segment.py); `end` ends it
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
        segment = run.segment
        assert segment is not None
        sampling = run.fact.sampling
        return SamplingParams(
            # The engine counts the replayed tokens too; earlier segments' tokens count against the cap.
            max_new_tokens=sampling.max_new_tokens - segment.generated_before,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seed=sampling.seed,
            top_logprobs=sampling.top_logprobs,
            logprobs=run.fact.logprobs,  # what the response's events carry (see _logprob_entry)
            frequency_penalty=sampling.frequency_penalty,
            presence_penalty=sampling.presence_penalty,
            stop_token_ids=self.runtime.chat_format.stop_token_ids(),
        )

    def _forget(self, response_id: str, *, in_engine: bool = True) -> None:
        """The run leaves: out of `active`, its outputs of the steps already submitted ignored (_left_at), its
        clock stopped; with `in_engine`, removed from the engine by the engine thread's next job, not awaited
        (_drop awaits it)."""
        self.active.pop(response_id, None)
        self._left_at[response_id] = self._steps_submitted
        self.clock.ended(response_id)
        if in_engine:
            removal = self._engine_thread.submit(self.runtime.engine.remove_sequence, response_id)
            removal.add_done_callback(functools.partial(_log_failed_removal, response_id))

    async def _drop(self, response_id: str) -> None:
        """_forget, returning once the engine has removed the run."""
        self._forget(response_id, in_engine=False)
        await self._in_engine(self.runtime.engine.remove_sequence, response_id)
