"""Client-run tools with their own item types: `shell`, `local_shell`, `apply_patch`, and a namespace's functions.

The model sees each as a function (`functions.shell`, ...) whose JSON schema is the SDK's action shape, so its
call is constrained like any function call; the call comes back as the SDK's own item (`shell_call`,
`local_shell_call`, `apply_patch_call`, or a `function_call` carrying `namespace`). Sent back as history, the
calls and their outputs are read by the model as that function's call and result (`as_function_item`).
"""

from __future__ import annotations

import json
from typing import Any, Literal

ClientKind = Literal["shell", "local_shell", "apply_patch"]
CLIENT_TOOL_TYPES: tuple[ClientKind, ...] = ("shell", "local_shell", "apply_patch")

# Bounded, so that an action's numbers fit every client's integers (at most a day; a gigabyte of output).
_MS = {"type": "integer", "minimum": 0, "maximum": 86_400_000}
_LENGTH = {"type": "integer", "minimum": 0, "maximum": 1_000_000_000}
_STRINGS = {"type": "array", "items": {"type": "string"}}
# The function each tool is offered as; its name is the tool's type (a request's names are unique, see requests).
CLIENT_FUNCTIONS: dict[ClientKind, dict[str, Any]] = {
    "shell": {
        "type": "function",
        "name": "shell",
        "description": "Run shell commands on the user's machine; returns each command's stdout, stderr and outcome.",
        "parameters": {
            "type": "object",
            "properties": {"commands": _STRINGS, "timeout_ms": _MS, "max_output_length": _LENGTH},
            "required": ["commands"],
            "additionalProperties": False,
        },
    },
    "local_shell": {
        "type": "function",
        "name": "local_shell",
        "description": "Execute a command (argv) on the user's machine; returns its output.",
        "parameters": {
            "type": "object",
            "properties": {
                "command": _STRINGS,
                "env": {"type": "object", "additionalProperties": {"type": "string"}},
                "working_directory": {"type": "string"},
                "timeout_ms": _MS,
            },
            "required": ["command"],
            "additionalProperties": False,
        },
    },
    "apply_patch": {
        "type": "function",
        "name": "apply_patch",
        "description": (
            "Create, update or delete one file on the user's machine. `diff` is a V4A diff (for create_file, "
            "the new file's lines each prefixed with '+'); delete_file takes no diff."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "type": {"type": "string", "enum": ["create_file", "update_file", "delete_file"]},
                "path": {"type": "string"},
                "diff": {"type": "string"},
            },
            "required": ["type", "path"],
            "additionalProperties": False,
        },
    },
}

CALL_TYPES: dict[ClientKind, str] = {k: f"{k}_call" for k in CLIENT_TOOL_TYPES}
OUTPUT_TYPES: dict[ClientKind, str] = {k: f"{k}_call_output" for k in CLIENT_TOOL_TYPES}
ITEM_PREFIX: dict[str, str] = {
    "shell_call": "sh",
    "shell_call_output": "sho",
    "local_shell_call": "lsh",
    "local_shell_call_output": "lsho",
    "apply_patch_call": "apc",
    "apply_patch_call_output": "apco",
}


def client_call(name: str | None, tools: list[dict[str, Any]]) -> ClientKind | None:
    """The client tool a call to function `name` addresses in a response offering `tools` (as echoed), if any."""
    if name in CLIENT_TOOL_TYPES and any(tool.get("type") == name for tool in tools):
        return name
    return None


def call_namespace(name: str | None, tools: list[dict[str, Any]]) -> str | None:
    """The namespace tool whose function `name` is (names are unique across a request), if any."""
    for tool in tools:
        if tool.get("type") == "namespace" and any(inner.get("name") == name for inner in tool.get("tools") or []):
            return str(tool["name"])
    return None


def _arguments(text: str) -> dict[str, Any]:
    """The call's arguments: the constraint makes them well-formed; a call cut short reads as empty."""
    try:
        parsed = json.loads(text)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _ints(args: dict[str, Any], *names: str) -> dict[str, int]:
    return {name: args[name] for name in names if isinstance(args.get(name), int) and not isinstance(args[name], bool)}


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def call_fields(kind: ClientKind, arguments: str) -> dict[str, Any]:
    """The SDK fields of a `<kind>_call` item made from the function call's JSON arguments."""
    args = _arguments(arguments)
    if kind == "shell":
        limits = _ints(args, "timeout_ms", "max_output_length")
        return {"action": {"commands": _strings(args.get("commands")), **limits}}
    if kind == "local_shell":
        env: dict[str, Any] = args["env"] if isinstance(args.get("env"), dict) else {}
        action: dict[str, Any] = {
            "type": "exec",
            "command": _strings(args.get("command")),
            "env": {k: v for k, v in env.items() if isinstance(v, str)},
            **_ints(args, "timeout_ms"),
        }
        if isinstance(args.get("working_directory"), str):
            action["working_directory"] = args["working_directory"]
        return {"action": action}
    op = args.get("type") if args.get("type") in ("create_file", "update_file", "delete_file") else "update_file"
    operation: dict[str, Any] = {"type": op, "path": str(args.get("path") or "")}
    if op != "delete_file":
        operation["diff"] = str(args.get("diff") or "")
    return {"operation": operation}


def call_arguments(item: dict[str, Any]) -> str:
    """A client tool call item's arguments as the model wrote them (the inverse of call_fields)."""
    kind = item.get("type")
    if kind == "apply_patch_call":
        return json.dumps(item.get("operation") or {}, ensure_ascii=False)
    action = dict(item.get("action") or {})
    if kind == "local_shell_call":
        action.pop("type", None)
        if not action.get("env"):
            action.pop("env", None)
        action = {k: v for k, v in action.items() if v is not None and k != "user"}
    else:
        action = {k: v for k, v in action.items() if v is not None}
    return json.dumps(action, ensure_ascii=False)


def output_text(item: dict[str, Any]) -> str:
    """What the model reads as a client tool's result."""
    kind = item.get("type")
    if kind == "shell_call_output":
        chunks = []
        for chunk in item.get("output") or []:
            outcome = chunk.get("outcome") or {}
            ending = "timed out" if outcome.get("type") == "timeout" else f"exit code {outcome.get('exit_code')}"
            chunks.append(f"stdout:\n{chunk.get('stdout', '')}\nstderr:\n{chunk.get('stderr', '')}\n({ending})")
        return "\n\n".join(chunks)
    if kind == "apply_patch_call_output":
        status = "applied" if item.get("status") == "completed" else "failed"
        return f"Patch {status}." + (f"\n{item['output']}" if item.get("output") else "")
    return str(item.get("output") or "")


def as_function_item(item: dict[str, Any]) -> dict[str, Any]:
    """A client tool's call or output as the function call or output the model saw; any other item unchanged."""
    kind = item.get("type")
    call_kind = next((k for k, t in CALL_TYPES.items() if t == kind), None)
    if call_kind is not None:
        arguments = call_arguments(item)
        return {"type": "function_call", "call_id": item["call_id"], "name": call_kind, "arguments": arguments}
    if kind in OUTPUT_TYPES.values():
        # local_shell_call_output names its call by `id` (OpenAI's shape); the others by `call_id`.
        call_id = item.get("call_id") if kind != "local_shell_call_output" else item.get("call_id") or item.get("id")
        return {"type": "function_call_output", "call_id": call_id, "output": output_text(item)}
    return item
