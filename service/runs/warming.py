"""Warming the prefix cache: the next turn of a finished conversation is rendered and prefilled by an idle
engine, and, with Settings.warm_while_decoding, a continued conversation's next turn beside its decoding, so a
client that continues it waits only for the prefill of what it adds."""

from __future__ import annotations

import collections
import copy
import functools
import logging
import time
from collections.abc import Callable

from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.model_runtime import ModelRuntime
from service.notify import Notifier
from service.prompting.base import PartialTurn, next_turn_prefix
from service.runs.core import SupervisorCore
from service.runs.state import ActiveRun, prompt_request_from_fact

log = logging.getLogger(__name__)

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
# How long an engine left idle by a finished run waits before it warms: a client's next request often follows at
# once (a script, an agent's tool loop), and a warming chunk already running would hold it up (back to back on the
# Qwen shape: first delta ~350 ms instead of ~280, docs/performance/2026-12-07-side-by-side-amx.md).
# Warming helps a next turn that comes after a pause; this delays it by a small part of any such pause. Not for a
# conversation already continued (warm_while_decoding): its next turn is taken to follow at once, and most of it
# was warmed beside its decoding.
IDLE_WARM_DELAY_S = 0.1


class Warming(SupervisorCore):
    def __init__(self, db: AsyncEngine, runtime: ModelRuntime, notifier: Notifier, settings: Settings) -> None:
        super().__init__(db, runtime, notifier, settings)
        # Finished conversations' next-turn prompts, rendered and prefilled by an idle engine (_warm_some).
        self._to_warm: collections.deque[Callable[[], list[int]]] = collections.deque(maxlen=WARM_QUEUE)
        # Continued conversations' next turns, prefilled beside decoding runs too (_warm_beside).
        self._warm_now: collections.deque[Callable[[], list[int]]] = collections.deque(maxlen=WARM_QUEUE)
        self._warming_beside = False  # the engine has such warming left (engine thread only)
        self._warm_after = 0.0  # time.monotonic() before which an idle engine does not warm (IDLE_WARM_DELAY_S)

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
        if self._continues_conversation(run):
            self._warm_now.append(render)  # warmed at once: mostly done beside its decoding already
        else:
            self._to_warm.append(render)
            self._warm_after = time.monotonic() + IDLE_WARM_DELAY_S

    def _idle_warm_delay(self) -> float:
        """Seconds an idle engine still waits before it warms (0 when it may warm now: a continued conversation's
        next turn is warmed at once)."""
        return 0.0 if self._warm_now else max(0.0, self._warm_after - time.monotonic())

    def _continues_conversation(self, run: ActiveRun) -> bool:
        """Whether the run's next turn is warmed as it decodes: with warm_while_decoding, when its prompt holds an
        earlier turn of the model (an answer, a call, a call's output)."""
        if not self.settings.warm_while_decoding or getattr(self.runtime.engine, "prefix_cache", None) is None:
            return False
        return any(
            item.get("type", "message") != "message" or item.get("role") == "assistant"
            for item in run.fact.prompt_items
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
