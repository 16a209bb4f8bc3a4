"""The Response object as it stands before generation, and what ends one."""

from __future__ import annotations

from typing import Any

from service.protocol.requests import CreateResponseRequest
from service.protocol.tools import echoed_tool


def initial_response(
    request: CreateResponseRequest, *, response_id: str, model: str, created_at: int, max_output_tokens: int | None
) -> dict[str, Any]:
    """The Response object as it stands before generation starts: every field of OpenAI's Response
    (and the Open Responses ResponseResource), echoing what the request set or the defaults used."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": "queued" if request.background else "in_progress",
        "background": request.background,
        "conversation": None,  # conversations are not supported (a request naming one is a 400)
        "error": None,
        "incomplete_details": None,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens if request.max_output_tokens is not None else max_output_tokens,
        "max_tool_calls": request.max_tool_calls,
        "metadata": request.metadata or {},
        "model": model,
        "output": [],
        "parallel_tool_calls": request.parallel_tool_calls,
        "previous_response_id": request.previous_response_id,
        "prompt": None,  # stored prompt templates are not supported (a request naming one is a 400)
        "prompt_cache_key": request.prompt_cache_key,
        "prompt_cache_retention": request.prompt_cache_retention,
        "reasoning": _reasoning(request),
        "safety_identifier": request.safety_identifier,
        "service_tier": "default",
        "store": request.store,
        "temperature": 1.0 if request.temperature is None else request.temperature,
        "top_p": 1.0 if request.top_p is None else request.top_p,
        "presence_penalty": 0.0 if request.presence_penalty is None else request.presence_penalty,
        "frequency_penalty": 0.0 if request.frequency_penalty is None else request.frequency_penalty,
        "text": {"format": _text_format(request), "verbosity": (request.text and request.text.verbosity) or "medium"},
        "tool_choice": request.tool_choice
        if isinstance(request.tool_choice, str)
        else request.tool_choice.model_dump(),
        # MCP secrets (headers, authorization) never reach the stored Response.
        "tools": [echoed_tool(tool) for tool in request.tools],
        "top_logprobs": request.top_logprobs or 0,
        "truncation": request.truncation or "disabled",
        "usage": None,
        "user": request.user,
        "completed_at": None,
    }


def _reasoning(request: CreateResponseRequest) -> dict[str, Any]:
    """`reasoning` echoed as sent (effort as named, not the level it maps to)."""
    sent = request.reasoning
    echoed: dict[str, Any] = {"effort": sent.effort if sent else None, "summary": sent.summary if sent else None}
    if sent is not None and sent.generate_summary is not None:
        echoed["generate_summary"] = sent.generate_summary
    return echoed


def _text_format(request: CreateResponseRequest) -> dict[str, Any]:
    if request.text is None or request.text.format is None:
        return {"type": "text"}
    fmt = request.text.format.model_dump(mode="json", exclude_none=True)
    if fmt["type"] == "json_schema":  # echoed with every field, as OpenAI does
        fmt = {**fmt, "description": fmt.get("description"), "strict": bool(fmt.get("strict"))}
    return fmt


TERMINAL_EVENT_TYPES = frozenset({"response.completed", "response.incomplete", "response.failed"})
TERMINAL_STATUSES = frozenset({"completed", "incomplete", "failed", "cancelled"})
