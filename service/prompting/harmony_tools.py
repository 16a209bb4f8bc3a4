"""Feeding a server-side tool's result back to a Harmony model mid-response.

A call ends the model's turn with `<|call|>`. The agent loop then appends the tool's message and the next
assistant header start to the sequence, so the continuation is exactly what rendering the whole
conversation (prompt, the call, the result) for completion would give: no re-prefill of what was generated.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from openai_harmony import Author, HarmonyEncoding, Message, Role

from service.prompting.harmony_render import BoundedRenderer

# Output items of server-side tools, as they come back in a conversation's history.
SERVER_ITEM_TYPES = frozenset(
    {"mcp_list_tools", "mcp_call", "mcp_approval_request", "mcp_approval_response", "code_interpreter_call"}
)


def tool_author(namespace: str, name: str) -> str:
    """The tool's name as the model addressed it: `<namespace>.<name>` (an MCP server_label), or `python`."""
    return f"{namespace}.{name}" if name else namespace


def tool_result_tokens(encoding: HarmonyEncoding, author: str, text: str) -> list[int]:
    """Tokens to append after a call's `<|call|>`: the tool's message, then `<|start|>assistant`. The output is
    tokenized in bounded pieces (see bounded_encode): a megabyte of one character must not hold the GIL."""
    return BoundedRenderer(encoding).message(tool_message(author, text)) + list(
        encoding.encode("<|start|>assistant", allowed_special="all")
    )


def tool_message(author: str, text: str) -> Message:
    return (
        Message.from_author_and_content(Author.new(Role.TOOL, author), text)
        .with_channel("commentary")
        .with_recipient("assistant")
    )


def call_message(recipient: str, body: str, *, json_body: bool) -> Message:
    message = Message.from_role_and_content(Role.ASSISTANT, body).with_channel("commentary").with_recipient(recipient)
    return message.with_content_type("<|constrain|>json") if json_body else message


def result_text(output: str | None, error: Any) -> str:
    """What the model reads as a call's result: its output, or its error."""
    if error:
        message = error.get("message") if isinstance(error, dict) else str(error)
        return f"Error: {message}"
    return output or ""


def server_item_messages(item: dict[str, Any], items: Sequence[dict[str, Any]]) -> list[Message]:
    """A server-side tool's history item as the Harmony messages the model saw (or would have seen).

    An approval request whose call later ran is shown once, by its `mcp_call`; a refused one is followed by
    a tool message saying so; an approved one not yet run ends the prompt at its `<|call|>`
    (HarmonyFormat.approved_call_prompt)."""
    kind = item.get("type")
    if kind == "mcp_approval_response" and not item.get("approve"):
        request = next(
            (
                i
                for i in items
                if i.get("type") == "mcp_approval_request" and i.get("id") == item.get("approval_request_id")
            ),
            None,
        )
        if request is None:
            return []
        reason = f" Reason: {item['reason']}" if item.get("reason") else ""
        return [
            tool_message(tool_author(request["server_label"], request["name"]), f"The user declined this call.{reason}")
        ]
    if kind == "mcp_approval_request" and any(
        i.get("type") == "mcp_call" and i.get("approval_request_id") == item.get("id") for i in items
    ):
        return []
    if kind == "mcp_call":
        author = tool_author(item["server_label"], item["name"])
        return [
            call_message(author, item.get("arguments") or "", json_body=True),
            tool_message(author, result_text(item.get("output"), item.get("error"))),
        ]
    if kind == "mcp_approval_request":
        return [
            call_message(tool_author(item["server_label"], item["name"]), item.get("arguments") or "", json_body=True)
        ]
    if kind == "code_interpreter_call":
        logs = "".join(o.get("logs", "") for o in item.get("outputs") or [] if isinstance(o, dict))
        return [call_message("python", item.get("code") or "", json_body=False), tool_message("python", logs)]
    return []  # mcp_list_tools: the tools are in the developer message; approval responses: see agent/setup.py
