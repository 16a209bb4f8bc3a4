"""Commands: validate, append to the log, hand off to the run supervisor. No generation here."""

from __future__ import annotations

import asyncio
import functools
import json
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from service import observability as metrics
from service.agent.items import auto_container_id, wants_auto_container
from service.agent.runtime import ToolRuntime
from service.config import Settings
from service.constraints.number_bounds import request_integer_digits
from service.constraints.plan import constraint_spec
from service.containers import Containers
from service.errors import InvalidRequest, NotFound
from service.item_references import resolve_references
from service.limits import check_runs
from service.log.facts import ApprovedCall, RequestFact, Sampling, decode_as, fact_data
from service.model_runtime import ModelRuntime
from service.notify import Notifier
from service.prompt_assembly import PromptAssembler, conversation_of
from service.prompting.base import PromptRequest
from service.protocol import (
    TERMINAL_STATUSES,
    CreateResponseRequest,
    initial_response,
    is_response_id,
    new_response_id,
    normalize_input,
    wants_logprobs,
)
from service.protocol.requests import refuse_not_offered
from service.protocol.tools import constraint_choice
from service.runs import RunSupervisor
from service.store import leases, read_models, recorder
from service.store.schema import DEFAULT_PROJECT
from service.stream_builder import StreamBuilder
from service.tools.secrets import redact


@dataclass(frozen=True)
class CreatedResponse:
    response_id: str
    response: dict[str, Any]


class Commands:
    def __init__(
        self,
        db: AsyncEngine,
        runtime: ModelRuntime,
        supervisor: RunSupervisor,
        notifier: Notifier,
        settings: Settings,
        *,
        tools: ToolRuntime | None = None,
    ) -> None:
        """`tools`: the server-side tools, shared with the supervisor (by default the supervisor's)."""
        self.db = db
        self.runtime = runtime
        self.supervisor = supervisor
        self.notifier = notifier
        self.settings = settings
        self.tools = tools if tools is not None else supervisor.tools
        self.prompts = PromptAssembler(db, runtime, self.tools)

    async def create(
        self,
        request: CreateResponseRequest,
        *,
        project: str = DEFAULT_PROJECT,
        compaction_item: dict[str, Any] | None = None,
    ) -> CreatedResponse:
        """A new response owned by `project` (the project of the key that asked); `compaction_item`: the
        output item of a `context_management` compaction (service/http/compaction_routes.py)."""
        if request.model not in (None, self.runtime.model_id):
            raise NotFound(
                f"The model '{request.model}' does not exist. This server serves '{self.runtime.model_id}'.",
                param="model",
            )
        context = self.runtime.engine.max_context
        if request.max_output_tokens is not None and request.max_output_tokens >= context:
            raise InvalidRequest(
                f"max_output_tokens is {request.max_output_tokens}; this model's context window holds {context} "
                f"tokens, prompt included, so at most {context - 1} can be generated.",
                param="max_output_tokens",
                code="max_output_tokens_too_large",
            )
        if self.settings.refuse_unsupported_tools:
            refuse_not_offered(request)
        response_id = new_response_id()
        input_items = await resolve_references(self.db, normalize_input(request, response_id), project=project)
        prompt = await self.prompts.assemble(request, input_items, project=project)
        prompt_request, prompt_ids, server_tools = prompt.request, prompt.token_ids, prompt.server_tools
        if server_tools.approved_call is not None:
            approved = self.runtime.chat_format.approved_call_prompt(prompt_request, prompt_ids)
            if approved is None:
                raise InvalidRequest(
                    "An approving mcp_approval_response must be the last input item, right after its request.",
                    param="input",
                )
            prompt_ids = approved
        constraints = await self._constraints(request, prompt_request)
        room = self.runtime.engine.max_context - len(prompt_ids)
        # Like OpenAI: without max_output_tokens a run may use what remains of the context window.
        cap = request.max_output_tokens or self.settings.max_output_tokens_default or room
        max_new = min(cap, room)

        response = initial_response(
            request,
            response_id=response_id,
            model=self.runtime.model_id,
            created_at=int(time.time()),
            max_output_tokens=None,
        )
        conversation_id = conversation_of(request)
        if conversation_id is not None:
            response["conversation"] = {"id": conversation_id}
        seed = request.seed if request.seed is not None else self.settings.default_seed
        if seed is None:
            seed = secrets.randbits(63)
        fact = RequestFact(
            request=_redacted(request.model_dump(mode="json", exclude_none=True)),
            response=response,
            prompt_items=prompt_request.items,
            instructions=request.instructions,
            tools=prompt.tools,
            constraints=constraints,
            reasoning_effort=prompt.effort,
            prompt_token_ids=prompt_ids,
            input_item_count=len(input_items),
            conversation_id=conversation_id,
            # truncation='auto' may have dropped some of them from the prompt: keep them for the projections.
            input_items=input_items if prompt_request.items[-len(input_items) :] != input_items else None,
            mcp_listed=server_tools.listed,
            approved_call=None if (call := server_tools.approved_call) is None else decode_as(ApprovedCall, call),
            sealed_secrets=server_tools.sealed,
            mcp_secret_labels=sorted(server_tools.headers),  # names only: the headers stay in memory
            compaction_item=compaction_item,
            store=request.store,
            project=project,  # the owner, in the log, so that a rebuild keeps it
            logprobs=wants_logprobs(request),
            sampling=Sampling(
                max_new_tokens=max_new,
                temperature=1.0 if request.temperature is None else request.temperature,
                top_p=1.0 if request.top_p is None else request.top_p,
                seed=seed,
                top_logprobs=request.top_logprobs or 0,
                frequency_penalty=request.frequency_penalty or 0.0,
                presence_penalty=request.presence_penalty or 0.0,
            ),
        )
        created_event = StreamBuilder(response).created()[0]
        if server_tools.headers:  # in memory for the run; a background run also has them sealed in the fact
            self.tools.secrets.put(response_id, server_tools.headers)
        try:
            with metrics.EVENT_APPEND.labels("create").time():
                await recorder.create_response(
                    self.db,
                    request_fact=fact_data(fact),
                    created_event=created_event,
                    response=response,
                    input_items=input_items,
                    background=request.background,
                    lease_seconds=self.settings.lease_seconds,
                    project=project,
                    admit=self._admit,
                    also=self._auto_container(response_id, response, project),
                )
        except BaseException:
            self.tools.secrets.pop(response_id)  # refused, or never written
            raise
        await self.notifier.publish([response_id])
        self.supervisor.wake()
        return CreatedResponse(response_id, response)

    def _auto_container(
        self, response_id: str, response: dict[str, Any], project: str
    ) -> Callable[[Any], Awaitable[None]] | None:
        """`{"container": {"type": "auto"}}`: the response's own container, made in its create transaction."""
        if self.tools.containers is None or not wants_auto_container(response.get("tools") or []):
            return None
        return functools.partial(
            Containers.insert_auto,
            response_id=response_id,
            container_id=auto_container_id(response_id),
            project=project,
        )

    def _admit(self, project_runs: int, all_runs: int) -> None:
        """429 past the project's runs in flight, 503 past the server's queue bound (see limits.py); checked
        in the create transaction (recorder.create_response)."""
        check_runs(
            project_runs=project_runs,
            project_limit=self.settings.max_runs_per_project,
            all_runs=all_runs,
            queue_limit=self.settings.max_queued_runs,
        )

    async def count_input_tokens(self, request: CreateResponseRequest, *, project: str) -> int:
        """`usage.input_tokens` the same create request would report (same history, rendering, truncation)."""
        if request.model not in (None, self.runtime.model_id):
            raise NotFound(
                f"The model '{request.model}' does not exist. This server serves '{self.runtime.model_id}'.",
                param="model",
            )
        response_id = new_response_id()
        input_items = await resolve_references(self.db, normalize_input(request, response_id), project=project)
        return len((await self.prompts.assemble(request, input_items, project=project)).token_ids)

    async def _constraints(self, request: CreateResponseRequest, prompt_request: PromptRequest) -> dict[str, Any]:
        """The run's constraint fact; a schema or grammar that does not compile is a 400 here."""
        choice = request.tool_choice
        constraints = constraint_spec(
            tool_choice=constraint_choice(choice),
            text_format=prompt_request.response_format,
            max_tool_calls=getattr(request, "max_tool_calls", None),
            reasoning_budget=self.settings.reasoning_budget(prompt_request.reasoning_effort),
            # off the event loop: the request's text may be megabytes
            integer_digits=await asyncio.to_thread(request_integer_digits, _request_texts(prompt_request)),
        )
        limit = self.settings.max_grammar_bytes
        await asyncio.to_thread(self.runtime.check_constraints, prompt_request, constraints, max_grammar_bytes=limit)
        return constraints

    async def cancel(self, response_id: str, *, project: str) -> dict[str, Any]:
        """Idempotent: a finished background response is returned unchanged."""
        response = await self.get(response_id, project=project)
        if not response.get("background"):
            raise InvalidRequest(
                "Only responses created with background=true can be cancelled.",
                param="response_id",
                code="not_background",
            )
        if response["status"] in TERMINAL_STATUSES:
            return response
        await recorder.request_cancel(self.db, response_id, project=project)
        self.supervisor.wake()
        await self.notifier.publish([response_id])
        # Whoever owns the run ends it within one step; a run whose owner died ends when it is
        # claimed again, at the latest one lease later.
        deadline = time.monotonic() + self.settings.lease_seconds * 2 + 5
        while time.monotonic() < deadline:
            response = await self.get(response_id, project=project)
            if response["status"] in TERMINAL_STATUSES:
                return response
            await self.notifier.wait(response_id, timeout=self.settings.poll_interval_seconds)
        return await self.get(response_id, project=project)

    async def cancel_foreground(self, response_id: str, *, project: str, forget: bool = False) -> None:
        """The client of a plain or streaming request went away: record the run as cancelled.
        `forget` (store=false): delete the response as soon as its run has ended."""
        async with self.db.connect() as connection:
            run = await leases.get_run(connection, response_id, project=project)
        if run is not None and not run.done:
            await recorder.request_cancel(self.db, response_id, project=project)
            self.supervisor.wake()
        if forget:
            await self._wait_until_done(response_id)
            await self.forget_unstored(response_id, project=project)

    async def _wait_until_done(self, response_id: str) -> None:
        # The owner ends a cancelled run within a step; a dead owner's run ends when it is claimed.
        deadline = time.monotonic() + self.settings.lease_seconds * 2 + 5
        while time.monotonic() < deadline:
            async with self.db.connect() as connection:
                run = await leases.get_run(connection, response_id)
            if run is None or run.done:
                return
            await self.notifier.wait(response_id, timeout=self.settings.poll_interval_seconds)

    async def delete(self, response_id: str, *, project: str) -> None:
        if not is_response_id(response_id) or not await recorder.delete_response(self.db, response_id, project=project):
            raise NotFound(f"Response with id '{response_id}' not found.", param="response_id")
        await self.notifier.publish([response_id])
        if self.tools.containers is not None:  # its `auto` container's row, then files
            await self.tools.containers.delete_for_response(response_id)

    async def get(self, response_id: str, *, project: str) -> dict[str, Any]:
        """A stored response of `project` as clients see it; store=false responses are never visible."""
        if not is_response_id(response_id):
            raise NotFound(f"Response with id '{response_id}' not found.", param="response_id")
        async with self.db.connect() as connection:
            response = await read_models.get_response(connection, response_id, project=project)
        if response is None or response.get("store") is False:
            raise NotFound(f"Response with id '{response_id}' not found.", param="response_id")
        return response

    async def forget_unstored(self, response_id: str, *, project: str) -> None:
        """store=false: the client has read the end, so the response is deleted."""
        await recorder.delete_response(self.db, response_id, project=project)


def _redacted(request: dict[str, Any]) -> dict[str, Any]:
    """The request as logged: MCP `headers`/`authorization` removed (kept sealed apart, or in memory)."""
    return {**request, "tools": [redact(tool) for tool in request.get("tools") or []]}


def _request_texts(prompt_request: PromptRequest) -> Iterator[str]:
    """Every text of a request a model may copy a number from: its instructions, the whole input chain, the tools
    and the output format."""
    yield prompt_request.instructions or ""
    for part in (prompt_request.items, list(prompt_request.tools), prompt_request.response_format):
        yield json.dumps(part, default=str)
