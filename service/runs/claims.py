"""Admission and resume: claim runs (new ones, cancelled ones, those whose lease lapsed) up to the engine's
room, rebuild each from its log (replay of the logged tokens) and put it into the engine; a run that cannot
be started is failed right after what its log holds."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service import observability as metrics
from service.agent.calls import tool_facts
from service.config import Settings
from service.log.facts import CancelRequested, RequestFact, TokensFact, decode_as
from service.model_runtime import ModelRuntime
from service.notify import Notifier
from service.projection import project
from service.protocol import TERMINAL_EVENT_TYPES
from service.runs.state import ActiveRun, prompt_request_from_fact, replay_run
from service.runs.tool_calls import ToolCalls
from service.store import event_log, leases
from service.store.db import write_transaction
from service.store.faults import is_transient
from service.store.leases import ClaimedRun
from service.stream_builder import StreamBuilder

log = logging.getLogger(__name__)

_Logs = dict[str, tuple[list[event_log.StoredFact], list[event_log.StoredEvent]]]


def _payloads(logs: _Logs) -> dict[str, tuple[list[event_log.StoredFact], list[dict[str, Any]]]]:
    """Each run's facts, and its events as the dicts the stream builder replays."""
    return {rid: (facts, [e.payload() for e in stored]) for rid, (facts, stored) in logs.items()}


def _after(logged: list[dict[str, Any]]) -> int:
    """The sequence number after a run's logged events (past any hole an older version left)."""
    return logged[-1]["sequence_number"] + 1 if logged else 0


class Claims(ToolCalls):
    def __init__(self, db: AsyncEngine, runtime: ModelRuntime, notifier: Notifier, settings: Settings) -> None:
        super().__init__(db, runtime, notifier, settings)
        self._admission_failing = False  # the last claim met a store outage (logged once, not per retry)
        self._admitting: set[str] = set()  # runs the admission under way has claimed (see stop)

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
        request_facts = [f.data for f in facts if f.kind == RequestFact.KIND]
        if not request_facts or not logged:
            return None  # deleted meanwhile
        fact = decode_as(RequestFact, request_facts[0])
        token_facts = [decode_as(TokensFact, f.data) for f in facts if f.kind == TokensFact.KIND]
        cancelled = claimed.cancel_requested or any(f.kind == CancelRequested.KIND for f in facts)

        constraint = self.runtime.new_constraint(prompt_request_from_fact(fact), fact.constraints)
        run = replay_run(
            rid,
            fact,
            token_facts,
            logged,
            self.runtime.chat_format,
            constraint,
            tool_facts=tool_facts(facts),
            next_constraint=self._segment_constraint(fact),
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

    async def _run_after_log(self, response_id: str) -> tuple[ActiveRun, list[dict[str, Any]]]:
        """The run rebuilt to continue right after what its log holds, its tokens not replayed (so it adds no
        output), and its logged events."""
        facts, logged = await self._read_log(response_id)
        fact = decode_as(RequestFact, next(f.data for f in facts if f.kind == RequestFact.KIND))
        builder = StreamBuilder(fact.response, next_sequence_number=_after(logged))
        run = ActiveRun(response_id, fact, builder, self.runtime.chat_format.new_parser(), project(logged), 0)
        return run, logged

    async def _fail_from_log(self, response_id: str, message: str) -> None:
        """End a run with `response.failed` right after what its log holds; from inside a group commit (a write
        the store refused), so committed on its own rather than queued behind that commit."""
        try:
            run, logged = await self._run_after_log(response_id)
            if not logged or logged[-1]["type"] in TERMINAL_EVENT_TYPES:
                return
            write = run.write()
            run.finish(write, "failed", {"code": "server_error", "message": message})
            await self._commit_retrying([write])
        except Exception:
            log.exception("could not record the failure of run %s", response_id)
            return
        await self.notifier.publish([response_id], {response_id: [event_log.live(e) for e in write.encoded_events()]})

    async def _fail_unstarted(self, response_id: str, message: str) -> None:
        """End a run that could not be started (its tokens could not be replayed, or the engine refused it) with
        `response.failed` after what its log holds, through the group commit."""
        try:
            run, _ = await self._run_after_log(response_id)
            await self._commit_alone(run, "failed", {"code": "server_error", "message": message})
        except Exception:
            log.exception("could not record the failure of run %s", response_id)
