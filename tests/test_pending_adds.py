"""Newcomers for the engine thread (runs._PendingAdds): each add runs once, in arrival order, only in a step
that may serve it (a run that left the engine at step n joins no step before n), and its outcome reaches
the coroutine awaiting it."""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor

import pytest

from service.engine.base import EngineError
from service.runs.engine_worker import _PendingAdds


def test_a_step_takes_the_adds_it_may_serve_in_order_and_the_job_of_their_own_the_rest() -> None:
    async def scenario() -> tuple[list[str], list[str]]:
        loop = asyncio.get_running_loop()
        adds, ran = _PendingAdds(), list[str]()
        futures = {name: loop.create_future() for name in ("fresh", "left-at-5", "fresh-2")}
        for name, first in (("fresh", 0), ("left-at-5", 5), ("fresh-2", 0)):
            adds.put(functools.partial(ran.append, name), first_step=first, done=futures[name])
        with ThreadPoolExecutor(max_workers=1) as engine_thread:
            await loop.run_in_executor(engine_thread, adds.take, 3)  # step 3 starts
            await asyncio.gather(futures["fresh"], futures["fresh-2"])
            taken_by_step = list(ran)
            assert not futures["left-at-5"].done()
            await loop.run_in_executor(engine_thread, adds.take, None)  # its own job
            await futures["left-at-5"]
            await loop.run_in_executor(engine_thread, adds.take, None)  # nothing left: nothing runs twice
        return taken_by_step, ran

    taken_by_step, ran = asyncio.run(scenario())
    assert taken_by_step == ["fresh", "fresh-2"]
    assert ran == ["fresh", "fresh-2", "left-at-5"]


def test_an_engine_error_reaches_the_awaiting_coroutine() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        adds = _PendingAdds()
        done: asyncio.Future[None] = loop.create_future()

        def refuse() -> None:
            raise EngineError("prompt of 9000 tokens does not fit the context of 4096")

        adds.put(refuse, first_step=0, done=done)
        with ThreadPoolExecutor(max_workers=1) as engine_thread:
            await loop.run_in_executor(engine_thread, adds.take, None)
        with pytest.raises(EngineError, match="does not fit"):
            await done

    asyncio.run(scenario())
