"""What the parts of the run supervisor share: the runs it owns, the engine and store it drives, its
settings. The supervisor is built in layers, one module each, each a subclass of the one below it
(core, warming, engine_worker, group_commit, tool_calls, claims, supervisor), so a part calls only
what lies below it; the one call up (a refused write failing its run from the log) is declared here."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncEngine

from service import observability as metrics
from service.agent.runtime import ToolRuntime
from service.agent.segment import segment_constraint_spec
from service.agent.steps import ToolSteps
from service.config import Settings
from service.engine.admission import limit_for_engine
from service.engine.base import LogitsConstraint
from service.log.facts import RequestFact
from service.model_runtime import ModelRuntime
from service.notify import Notifier
from service.runs.state import ActiveRun, prompt_request_from_fact


class SupervisorCore:
    # The agent loop (service/agent/): the server's tools and the steps that execute runs' calls with them; set
    # by RunSupervisor from the ToolRuntime it is given (the same one the commands use).
    tools: ToolRuntime
    tool_steps: ToolSteps

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
        self.clock = metrics.RunClock()  # time to first token, inter-token latency
        # Admission by memory: the rest wait in the durable queue (the log).
        self.max_active = limit_for_engine(runtime.engine, settings.kv_cache_budget_bytes, settings.max_active_runs)
        # The agent loop: runs out of the engine while a server-side tool call of theirs is executed.
        self._tool_runs: dict[str, ActiveRun] = {}
        self._tool_tasks: set[asyncio.Task[None]] = set()

    def wake(self) -> None:
        self._wake.set()

    def _segment_constraint(self, fact: RequestFact) -> Callable[[int], LogitsConstraint | None]:
        """A run's constraint for its segment after `calls_made` tool calls (service/agent/segment.py)."""

        def make(calls_made: int) -> LogitsConstraint | None:
            spec = segment_constraint_spec(fact.constraints, calls_made)
            return self.runtime.new_constraint(prompt_request_from_fact(fact), spec)

        return make

    if TYPE_CHECKING:

        async def _fail_from_log(self, response_id: str, message: str) -> None:
            """service/runs/claims.py"""
