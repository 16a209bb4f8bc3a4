"""The Response object as it stands before generation, and what ends one."""

from __future__ import annotations

from typing import Any

from service.protocol.requests import CreateResponseRequest


def initial_response(
    request: CreateResponseRequest, *, response_id: str, model: str, created_at: float, max_output_tokens: int
) -> dict[str, Any]:
    """The Response object as it stands before generation starts."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": "queued" if request.background else "in_progress",
        "background": request.background,
        "error": None,
        "incomplete_details": None,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens or max_output_tokens,
        "metadata": request.metadata or {},
        "model": model,
        "output": [],
        "parallel_tool_calls": request.parallel_tool_calls,
        "previous_response_id": request.previous_response_id,
        "reasoning": {"effort": (request.reasoning.effort if request.reasoning else None), "summary": None},
        "store": request.store,
        "temperature": 1.0 if request.temperature is None else request.temperature,
        "text": {"format": _text_format(request)},
        "tool_choice": request.tool_choice
        if isinstance(request.tool_choice, str)
        else request.tool_choice.model_dump(),
        "tools": [tool.model_dump(exclude_none=False) for tool in request.tools],
        "top_p": 1.0 if request.top_p is None else request.top_p,
        "top_logprobs": request.top_logprobs or 0,
        "truncation": "disabled",
        "usage": None,
        "user": request.user,
        "completed_at": None,
    }


def _text_format(request: CreateResponseRequest) -> dict[str, Any]:
    if request.text is None or request.text.format is None:
        return {"type": "text"}
    return request.text.format.model_dump(mode="json", exclude_none=True)


TERMINAL_EVENT_TYPES = frozenset({"response.completed", "response.incomplete", "response.failed"})
TERMINAL_STATUSES = frozenset({"completed", "incomplete", "failed", "cancelled"})
