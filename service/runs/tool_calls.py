"""The agent loop's side of the supervisor (service/agent/steps.py): a run whose turn ended in a server-side tool
call leaves the engine, its call runs in a task of its own, and the run goes back into the engine with the
result (or ends) through the group commit."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from service.agent.steps import RunLost
from service.runs.group_commit import GroupCommit
from service.runs.state import ActiveRun
from service.stream_builder import Ending

log = logging.getLogger(__name__)


class ToolCalls(GroupCommit):
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
            run.constraint = self._segment_constraint(run.fact)(run.segment.calls_made)
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
