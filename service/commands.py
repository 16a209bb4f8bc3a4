"""Commands: validate, append to the log, hand off to the run supervisor. No generation here."""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.errors import InvalidRequest, NotFound
from service.model_runtime import ModelRuntime
from service.notify import Notifier
from service.prompting.base import PromptRequest
from service.protocol import (
    TERMINAL_STATUSES,
    CreateResponseRequest,
    initial_response,
    new_response_id,
    normalize_input,
    wants_logprobs,
)
from service.run_state import sampling_fact
from service.runs import RunSupervisor
from service.store import leases, read_models, recorder
from service.stream_builder import StreamBuilder


@dataclass(frozen=True)
class CreatedResponse:
    response_id: str
    response: dict[str, Any]


class Commands:
    def __init__(
        self, db: AsyncEngine, runtime: ModelRuntime, supervisor: RunSupervisor, notifier: Notifier, settings: Settings
    ) -> None:
        self.db = db
        self.runtime = runtime
        self.supervisor = supervisor
        self.notifier = notifier
        self.settings = settings

    async def create(self, request: CreateResponseRequest) -> CreatedResponse:
        if request.model not in (None, self.runtime.model_id):
            raise NotFound(
                f"The model '{request.model}' does not exist. This server serves '{self.runtime.model_id}'.",
                param="model",
            )
        response_id = new_response_id()
        input_items = normalize_input(request, response_id)
        history: list[dict[str, Any]] = []
        if request.previous_response_id is not None:
            history = await self._history(request.previous_response_id)

        tools = [] if request.tool_choice == "none" else [tool.model_dump() for tool in request.tools]
        effort = request.reasoning.effort if request.reasoning and request.reasoning.effort else "medium"
        prompt_request = PromptRequest(
            items=history + input_items, instructions=request.instructions, tools=tuple(tools), reasoning_effort=effort
        )
        prompt_ids = await asyncio.to_thread(self.runtime.render, prompt_request)
        room = self.runtime.engine.max_context - len(prompt_ids)
        if room < 1:
            raise InvalidRequest(
                f"The prompt is {len(prompt_ids)} tokens; "
                f"this model's context holds {self.runtime.engine.max_context}.",
                param="input",
                code="context_length_exceeded",
            )
        max_new = min(request.max_output_tokens or self.settings.max_output_tokens_default, room)

        created_at = time.time()
        response = initial_response(
            request,
            response_id=response_id,
            model=self.runtime.model_id,
            created_at=created_at,
            max_output_tokens=max_new,
        )
        seed = request.seed if request.seed is not None else secrets.randbits(63)
        fact = {
            "request": request.model_dump(mode="json", exclude_none=True),
            "response": response,
            "prompt_items": prompt_request.items,
            "instructions": request.instructions,
            "tools": tools,
            "reasoning_effort": effort,
            "prompt_token_ids": prompt_ids,
            "input_item_count": len(input_items),
            "store": request.store,
            "logprobs": wants_logprobs(request),
            "sampling": sampling_fact(
                max_new_tokens=max_new,
                temperature=1.0 if request.temperature is None else request.temperature,
                top_p=1.0 if request.top_p is None else request.top_p,
                seed=seed,
                top_logprobs=request.top_logprobs or 0,
            ),
        }
        created_event = StreamBuilder(response).created()[0]
        await recorder.create_response(
            self.db,
            request_fact=fact,
            created_event=created_event,
            response=response,
            input_items=input_items,
            background=request.background,
            lease_seconds=self.settings.lease_seconds,
        )
        await self.notifier.publish([response_id])
        self.supervisor.wake()
        return CreatedResponse(response_id, response)

    async def _history(self, previous_response_id: str) -> list[dict[str, Any]]:
        async with self.db.connect() as connection:
            previous = await read_models.get_response(connection, previous_response_id)
            if previous is None or previous.get("store") is False:
                raise NotFound(
                    f"Previous response with id '{previous_response_id}' not found.", param="previous_response_id"
                )
            if previous["status"] not in TERMINAL_STATUSES:
                raise InvalidRequest(
                    f"Previous response '{previous_response_id}' is still {previous['status']}.",
                    param="previous_response_id",
                    code="previous_response_in_progress",
                )
            return await read_models.conversation_history(connection, previous_response_id)

    async def cancel(self, response_id: str) -> dict[str, Any]:
        """Idempotent: a finished background response is returned unchanged."""
        response = await self.get(response_id)
        if not response.get("background"):
            raise InvalidRequest(
                "Only responses created with background=true can be cancelled.",
                param="response_id",
                code="not_background",
            )
        if response["status"] in TERMINAL_STATUSES:
            return response
        await recorder.request_cancel(self.db, response_id)
        self.supervisor.wake()
        await self.notifier.publish([response_id])
        # Whoever owns the run ends it within one step; a run whose owner died ends when it is
        # claimed again, at the latest one lease later.
        deadline = time.monotonic() + self.settings.lease_seconds * 2 + 5
        while time.monotonic() < deadline:
            response = await self.get(response_id)
            if response["status"] in TERMINAL_STATUSES:
                return response
            await self.notifier.wait(response_id, timeout=self.settings.poll_interval_seconds)
        return await self.get(response_id)

    async def cancel_foreground(self, response_id: str, *, forget: bool = False) -> None:
        """The client of a plain or streaming request went away: record the run as cancelled.
        `forget` (store=false): delete the response as soon as its run has ended."""
        async with self.db.connect() as connection:
            run = await leases.get_run(connection, response_id)
        if run is not None and not run.done:
            await recorder.request_cancel(self.db, response_id)
            self.supervisor.wake()
        if forget:
            await self._wait_until_done(response_id)
            await self.forget_unstored(response_id)

    async def _wait_until_done(self, response_id: str) -> None:
        # The owner ends a cancelled run within a step; a dead owner's run ends when it is claimed.
        deadline = time.monotonic() + self.settings.lease_seconds * 2 + 5
        while time.monotonic() < deadline:
            async with self.db.connect() as connection:
                run = await leases.get_run(connection, response_id)
            if run is None or run.done:
                return
            await self.notifier.wait(response_id, timeout=self.settings.poll_interval_seconds)

    async def delete(self, response_id: str) -> None:
        if not await recorder.delete_response(self.db, response_id):
            raise NotFound(f"Response with id '{response_id}' not found.", param="response_id")
        await self.notifier.publish([response_id])

    async def get(self, response_id: str) -> dict[str, Any]:
        """A stored response as clients see it; store=false responses are never visible."""
        async with self.db.connect() as connection:
            response = await read_models.get_response(connection, response_id)
        if response is None or response.get("store") is False:
            raise NotFound(f"Response with id '{response_id}' not found.", param="response_id")
        return response

    async def forget_unstored(self, response_id: str) -> None:
        """store=false: the client has read the end, so the response is deleted."""
        await recorder.delete_response(self.db, response_id)
