"""Input items as canonical Responses item dicts: the form the log, the prompt and the conversation store keep."""

from __future__ import annotations

from typing import Any

from service.protocol.ids import derived_id
from service.protocol.items import (
    ID_PREFIX,
    ClientToolItem,
    ConversationItem,
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    ItemReference,
    McpApprovalResponseItem,
    MessageItem,
    RefusalPart,
    client_tool_item,
)
from service.protocol.requests import CreateResponseRequest


def normalize_input(request: CreateResponseRequest, response_id: str) -> list[ConversationItem]:
    """The request's input as canonical Responses item dicts, each with a stable id."""
    items: list[Any] = (
        [MessageItem(role="user", content=request.input)] if isinstance(request.input, str) else request.input
    )
    return normalize_items(items, response_id, key="input", first_index=0)


def normalize_items(items: list[Any], owner_id: str, *, key: str, first_index: int) -> list[ConversationItem]:
    """Validated input items as canonical item dicts; an item without an id gets one derived from
    (owner, key, index), so a replay names it identically."""
    out: list[ConversationItem] = []
    for index, item in enumerate(items, start=first_index):
        item_id = item.id or derived_id(ID_PREFIX[item.type], owner_id, f"{key}:{index}")
        if isinstance(item, ItemReference):
            out.append({"id": item.id, "type": "item_reference"})  # resolved by service/item_references.py
        elif isinstance(item, MessageItem):
            part_type = "output_text" if item.role == "assistant" else "input_text"
            parts = [item.content] if isinstance(item.content, str) else item.content
            content: list[dict[str, Any]] = [
                {"type": "refusal", "refusal": part.refusal}
                if isinstance(part, RefusalPart)
                else {
                    "type": part_type,
                    "text": part if isinstance(part, str) else part.text,
                    **({"annotations": []} if part_type == "output_text" else {}),
                }
                for part in parts
            ]
            message = {"id": item_id, "type": "message", "role": item.role, "content": content, "status": "completed"}
            out.append({**message, "phase": item.phase} if item.phase is not None else message)
        elif isinstance(item, FunctionCallItem):
            out.append(
                {
                    "id": item_id,
                    "type": "function_call",
                    "call_id": item.call_id,
                    "name": item.name,
                    "arguments": item.arguments,
                    "status": "completed",
                    **({"namespace": item.namespace} if item.namespace is not None else {}),
                }
            )
        elif isinstance(item, CustomToolCallItem):
            out.append(
                {
                    "id": item_id,
                    "type": "custom_tool_call",
                    "call_id": item.call_id,
                    "name": item.name,
                    "input": item.input,
                    "status": "completed",
                }
            )
        elif isinstance(item, CustomToolCallOutputItem):
            out.append(
                {
                    "id": item_id,
                    "type": "custom_tool_call_output",
                    "call_id": item.call_id,
                    "output": _tool_output(item.output),
                    "status": "completed",
                }
            )
        elif isinstance(item, FunctionCallOutputItem):
            out.append(
                {
                    "id": item_id,
                    "type": "function_call_output",
                    "call_id": item.call_id,
                    "output": _tool_output(item.output),
                    "status": "completed",
                }
            )
        elif isinstance(item, ClientToolItem):
            out.append(client_tool_item(item, item_id))
        elif isinstance(item, McpApprovalResponseItem):
            answer = {"approval_request_id": item.approval_request_id, "approve": item.approve, "reason": item.reason}
            out.append({"id": item_id, "type": "mcp_approval_response", **answer})
        else:
            reasoning_parts = [{"type": "reasoning_text", "text": part.text} for part in item.content or []]
            out.append({"id": item_id, "type": "reasoning", "summary": [], "content": reasoning_parts})
    return out


def _tool_output(output: Any) -> Any:
    """A tool output as sent: a string, or its content parts without the fields the client left out."""
    return output if isinstance(output, str) else [part.model_dump(exclude_none=True) for part in output]
