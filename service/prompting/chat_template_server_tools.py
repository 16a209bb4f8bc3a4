"""Server-side tools (MCP, through the agent loop) for chat-template models.

- Names: the model sees an MCP server's tool as a function named `SERVER_LABEL.NAME` in the template's tool
  list. Function tool names cannot contain a dot, so the name alone maps a call back to its server and tool
  (`agent.items.classify`), exactly as Harmony's `to=SERVER_LABEL.NAME` recipient does.
- The code interpreter is a function `code_interpreter.python` with one argument, `code` (a dotted name,
  so no function tool can collide with it); the parser hands its code on as the call's body, like
  Harmony's `python` tool (`code_call_body`).
- History (`server_history_items`): an `mcp_call` item is rendered as that function call and its result, as
  Harmony does: an approval request as the call (shown once: not when its `mcp_call` follows), a refusal as
  the call's result saying so; listings carry nothing the model must read (the tools are in the tool list).
- Approved calls: a request approving the call its history ends with is rendered up to that call's turn
  (`approved_call_prompt`), which the run executes first, as the model's own call.
- Results: the continuation after a call is the template's own rendering of a tool result message (+ the
  generation prompt), cut right after the end-of-turn token the model sampled. It depends only on the
  tokenizer, the call's name and its result text, so a resumed run rebuilds the same tokens.
"""

from __future__ import annotations

import json
import re
from typing import Any

from service.constraints.compiler import GrammarSpec
from service.constraints.plan import PYTHON_TARGET, CallTarget

SERVER_ITEMS = ("mcp_call", "mcp_list_tools", "mcp_approval_request", "mcp_approval_response", "code_interpreter_call")
CODE_TOOL = "code_interpreter.python"
_CODE_DESCRIPTION = "Run Python code in a sandbox without network access; its output is returned."


def code_arguments_schema(max_code_chars: int | None) -> dict[str, Any]:
    code: dict[str, Any] = {"type": "string", **({"maxLength": max_code_chars} if max_code_chars else {})}
    return {"type": "object", "properties": {"code": code}, "required": ["code"], "additionalProperties": False}


def code_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """The code interpreter (model-facing tool `{"type": "python"}`) as the template's function tool."""
    parameters = code_arguments_schema(tool.get("max_code_chars"))
    return {
        "type": "function",
        "function": {"name": CODE_TOOL, "description": _CODE_DESCRIPTION, "parameters": parameters},
    }


def json_call_target(target: CallTarget) -> CallTarget:
    """A call target as the template's `<tool_call>` JSON writes it: the code interpreter's plain-code target
    (a regex bounding its length, or free) becomes CODE_TOOL with a `code` string argument."""
    if target.name != PYTHON_TARGET:
        return target
    bound = re.fullmatch(r"\(\?s:\.\{0,(\d+)\}\)", target.grammar.source) if target.grammar else None
    schema = code_arguments_schema(int(bound.group(1)) if bound else None)
    return CallTarget(CODE_TOOL, False, GrammarSpec.json_schema(schema, strict=False), target.param)


def code_call_body(name: str, arguments: Any) -> tuple[str, str] | None:
    """(name, body) of a parsed call to the code interpreter: `python` and its code; None for other calls."""
    if name == CODE_TOOL and isinstance(arguments, dict) and isinstance(arguments.get("code"), str):
        return "python", arguments["code"]
    return None


def model_tool_name(tool: dict[str, Any]) -> str:
    """The name a chat-template model calls a tool by: `LABEL.NAME` for an MCP server's tool."""
    if tool.get("type") == "mcp_function":
        return f"{tool['namespace']}.{tool['name']}"
    if tool.get("type") == "python":
        return CODE_TOOL
    return str(tool["name"])


def server_history_items(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`items` with each server-side tool item replaced by the function call/output items the template renders."""
    out: list[dict[str, Any]] = []
    for item in items:
        kind = item.get("type")
        if kind not in SERVER_ITEMS:
            out.append(item)
        elif kind == "mcp_call":
            out += mcp_call_items(item)
        elif kind == "code_interpreter_call":
            call_id = str(item.get("id") or "code_interpreter_call")
            arguments = json.dumps({"code": item.get("code") or ""}, ensure_ascii=False)
            logs = "".join(o.get("logs", "") for o in item.get("outputs") or [] if isinstance(o, dict))
            out.append({"type": "function_call", "call_id": call_id, "name": CODE_TOOL, "arguments": arguments})
            out.append({"type": "function_call_output", "call_id": call_id, "output": logs})
        elif kind == "mcp_approval_request":
            if not any(i.get("type") == "mcp_call" and i.get("approval_request_id") == item.get("id") for i in items):
                out.append(_call_item(str(item.get("id")), item))
        elif kind == "mcp_approval_response" and not item.get("approve"):
            reason = f" Reason: {item['reason']}" if item.get("reason") else ""
            call_id = str(item.get("approval_request_id"))
            out.append(
                {"type": "function_call_output", "call_id": call_id, "output": f"The user declined this call.{reason}"}
            )
    return out


def ends_with_approved_call(items: list[dict[str, Any]]) -> bool:
    """The items end with an approval request and the response approving it (the prompt ends at that call)."""
    if len(items) < 2:
        return False
    request, answer = items[-2], items[-1]
    return (
        request.get("type") == "mcp_approval_request"
        and answer.get("type") == "mcp_approval_response"
        and bool(answer.get("approve"))
        and answer.get("approval_request_id") == request.get("id")
    )


def _call_item(call_id: str, item: dict[str, Any]) -> dict[str, Any]:
    name = f"{item['server_label']}.{item['name']}"
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": item.get("arguments") or "{}"}


def mcp_call_items(item: dict[str, Any]) -> list[dict[str, Any]]:
    """An `mcp_call` history item as the function call and output items the template renders."""
    call_id = str(item.get("id") or "mcp_call")
    error = item.get("error")
    if error:
        message = error.get("message") if isinstance(error, dict) else str(error)
        output = f"Error: {message}"
    else:
        output = item.get("output") or ""
    return [_call_item(call_id, item), {"type": "function_call_output", "call_id": call_id, "output": output}]


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
