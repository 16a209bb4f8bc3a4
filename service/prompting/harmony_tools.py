"""Feeding a server-side tool's result back to a Harmony model mid-response.

A call ends the model's turn with `<|call|>`. The agent loop then appends the tool's message and the next
assistant header start to the sequence, so the continuation is exactly what rendering the whole
conversation (prompt, the call, the result) for completion would give: no re-prefill of what was generated.
"""

from __future__ import annotations

from openai_harmony import Author, HarmonyEncoding, Message, Role


def tool_author(namespace: str, name: str) -> str:
    """The tool's name as the model addressed it: `<namespace>.<name>` (an MCP server_label), or `python`."""
    return f"{namespace}.{name}" if name else namespace


def tool_result_tokens(encoding: HarmonyEncoding, author: str, text: str) -> list[int]:
    """Tokens to append after a call's `<|call|>`: the tool's message, then `<|start|>assistant`."""
    message = (
        Message.from_author_and_content(Author.new(Role.TOOL, author), text)
        .with_channel("commentary")
        .with_recipient("assistant")
    )
    return list(encoding.render(message)) + list(encoding.encode("<|start|>assistant", allowed_special="all"))
