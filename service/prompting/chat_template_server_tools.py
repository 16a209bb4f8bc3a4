"""Server-side tools (MCP, through the agent loop) for chat-template models.

- Names: the model sees an MCP server's tool as a function named `SERVER_LABEL.NAME` in the template's tool
  list. Function tool names cannot contain a dot, so the name alone maps a call back to its server and tool
  (`server_items.classify`), exactly as Harmony's `to=SERVER_LABEL.NAME` recipient does.
- History: an `mcp_call` item is rendered as that function call and its result; listing and approval items
  carry nothing the model must read.
- Results: the continuation after a call is the template's own rendering of a tool result message (+ the
  generation prompt), cut right after the end-of-turn token the model sampled. It depends only on the
  tokenizer, the call's name and its result text, so a resumed run rebuilds the same tokens.
"""

from __future__ import annotations

import json
from typing import Any

SKIPPED_ITEMS = ("mcp_list_tools", "mcp_approval_request", "mcp_approval_response")


def model_tool_name(tool: dict[str, Any]) -> str:
    """The name a chat-template model calls a tool by: `LABEL.NAME` for an MCP server's tool."""
    if tool.get("type") == "mcp_function":
        return f"{tool['namespace']}.{tool['name']}"
    return str(tool["name"])


def mcp_call_items(item: dict[str, Any]) -> list[dict[str, Any]]:
    """An `mcp_call` history item as the function call and output items the template renders."""
    call_id = str(item.get("id") or "mcp_call")
    name = f"{item['server_label']}.{item['name']}"
    error = item.get("error")
    if error:
        message = error.get("message") if isinstance(error, dict) else str(error)
        output = f"Error: {message}"
    else:
        output = item.get("output") or ""
    return [
        {"type": "function_call", "call_id": call_id, "name": name, "arguments": item.get("arguments") or "{}"},
        {"type": "function_call_output", "call_id": call_id, "output": output},
    ]


def result_text_after_turn(render_text: Any, eos_text: str, name: str, result: str) -> str:
    """The text that follows the model's end-of-turn token when the template renders `result` as the answer
    of a call to `name`, through the generation prompt. `render_text(messages, add_generation_prompt)`
    renders Responses items with the model's template."""
    call = {"type": "function_call", "call_id": "call_0", "name": name, "arguments": json.dumps({})}
    base = [{"type": "message", "role": "user", "content": "x"}, call]
    before = render_text(base, False)
    after = render_text([*base, {"type": "function_call_output", "call_id": "call_0", "output": result}], True)
    cut = before.rfind(eos_text)
    if cut < 0 or not after.startswith(before[: cut + len(eos_text)]):
        raise ValueError("this chat template does not render a tool result after the assistant's turn")
    return str(after[cut + len(eos_text) :])
