"""The open items of tool calls with items of their own: a client tool's (shell, local_shell, apply_patch), which
is filled in when its arguments end, and a server-side tool's (MCP call, approval request, code interpreter),
which waits for its result. The StreamBuilder opens them like the items of stream_items.py."""

from __future__ import annotations

from typing import Any

from service.agent.items import ITEM_PREFIX as SERVER_PREFIX
from service.agent.items import ServerCall, mcp_error, new_item
from service.protocol.client_tools import CALL_TYPES, ITEM_PREFIX, ClientKind, call_fields
from service.protocol.events import (
    CodeInterpreterCodeDeltaEvent,
    CodeInterpreterCodeDoneEvent,
    McpCallArgumentsDeltaEvent,
    McpCallArgumentsDoneEvent,
)
from service.protocol.output import (
    ApplyPatchCall,
    ClientCallItem,
    CodeInterpreterCall,
    CodeInterpreterLogs,
    LocalShellAction,
    LocalShellCall,
    Logprob,
    McpApprovalRequest,
    McpCall,
    PatchOperation,
    ServerToolItem,
    ShellAction,
    ShellCall,
)
from service.stream_items import Closing, OpenItem, Sink, call_id, item_id


class OpenClientCall(OpenItem[ClientCallItem]):
    """A shell/local_shell/apply_patch call: added with an empty action (the SDK requires one before the
    arguments are known, and has no argument delta events for these items), filled in when it closes."""

    @classmethod
    def start(cls, kind: ClientKind, response_id: str, index: int, out: Sink) -> OpenClientCall:
        id_ = item_id(ITEM_PREFIX[CALL_TYPES[kind]], response_id, index)
        call_id_ = call_id(response_id, index)
        item_: ClientCallItem
        if kind == "shell":
            action = ShellAction(commands=[])
            item_ = ShellCall(id=id_, type="shell_call", status="in_progress", call_id=call_id_, action=action)
        elif kind == "local_shell":
            exec_ = LocalShellAction(type="exec", command=[], env={})
            item_ = LocalShellCall(
                id=id_, type="local_shell_call", status="in_progress", call_id=call_id_, action=exec_
            )
        else:
            patch = PatchOperation(type="update_file", path="", diff="")
            item_ = ApplyPatchCall(
                id=id_, type="apply_patch_call", status="in_progress", call_id=call_id_, operation=patch
            )
        out.item("added", index, item_)
        return cls(item_, index)

    def close(self, status: Closing, out: Sink) -> None:
        item_, arguments = self.item, "".join(self.text)
        if isinstance(item_, ShellCall):
            item_.action = ShellAction.model_validate(call_fields("shell", arguments)["action"])
            item_.status = status
        elif isinstance(item_, LocalShellCall):
            item_.action = LocalShellAction.model_validate(call_fields("local_shell", arguments)["action"])
            item_.status = status
        else:
            item_.operation = PatchOperation.model_validate(call_fields("apply_patch", arguments)["operation"])
            item_.status = "completed" if status == "completed" else "in_progress"  # the SDK has no incomplete
        out.item("done", self.index, item_)


class OpenServerCall(OpenItem[ServerToolItem]):
    """An MCP call, an approval request or a code interpreter call: a whole call waits for its result
    (`calling`, once closed whole), which the builder's `tool_result` brings; an approval request is done when
    its arguments are."""

    def __init__(self, item: ServerToolItem, index: int) -> None:
        super().__init__(item, index)
        self.calling: McpCall | CodeInterpreterCall | None = None

    @classmethod
    def start(
        cls, call: ServerCall, response_id: str, index: int, tools: list[dict[str, Any]], out: Sink
    ) -> OpenServerCall:
        item_ = new_item(call, item_id(SERVER_PREFIX[call.kind], response_id, index), response_id, tools)
        out.item("added", index, item_)
        if isinstance(item_, McpCall):
            out.status("response.mcp_call.in_progress", item_.id, index)
        elif isinstance(item_, CodeInterpreterCall):
            out.status("response.code_interpreter_call.in_progress", item_.id, index)
        return cls(item_, index)

    def delta(self, text: str, logprobs: list[Logprob], out: Sink) -> None:
        self.text.append(text)
        if isinstance(self.item, CodeInterpreterCall):
            out.send(
                CodeInterpreterCodeDeltaEvent(
                    type="response.code_interpreter_call_code.delta",
                    sequence_number=out.number(),
                    item_id=self.item.id,
                    output_index=self.index,
                    delta=text,
                )
            )
        elif isinstance(self.item, McpCall):
            out.send(
                McpCallArgumentsDeltaEvent(
                    type="response.mcp_call_arguments.delta",
                    sequence_number=out.number(),
                    item_id=self.item.id,
                    output_index=self.index,
                    delta=text,
                )
            )
        # an approval request has no argument events: its done item carries them

    def close(self, status: Closing, out: Sink) -> None:
        item_, index, text = self.item, self.index, "".join(self.text)
        if isinstance(item_, CodeInterpreterCall):
            item_.code = text
            out.send(
                CodeInterpreterCodeDoneEvent(
                    type="response.code_interpreter_call_code.done",
                    sequence_number=out.number(),
                    item_id=item_.id,
                    output_index=index,
                    code=text,
                )
            )
        else:
            item_.arguments = text
        if isinstance(item_, McpCall):
            out.send(
                McpCallArgumentsDoneEvent(
                    type="response.mcp_call_arguments.done",
                    sequence_number=out.number(),
                    item_id=item_.id,
                    output_index=index,
                    arguments=text,
                )
            )
        if isinstance(item_, McpApprovalRequest):
            out.item("done", index, item_)
        elif status != "completed":
            item_.status = "incomplete"
            out.item("done", index, item_)
        elif isinstance(item_, CodeInterpreterCall):
            item_.status = "interpreting"
            out.status("response.code_interpreter_call.interpreting", item_.id, index)
            self.calling = item_
        else:
            item_.status = "calling"
            self.calling = item_


def call_result(
    item_: McpCall | CodeInterpreterCall, index: int, output: str | None, error: str | None, out: Sink
) -> None:
    """A server-side call returned: its item is done (a code interpreter's error is its logs)."""
    if isinstance(item_, CodeInterpreterCall):
        logs = output if output is not None else (error or "")
        item_.outputs = [CodeInterpreterLogs(type="logs", logs=logs)]
        item_.status = "completed" if error is None else "failed"
        out.status("response.code_interpreter_call.completed", item_.id, index)
    else:
        item_.output = output
        item_.error = mcp_error(error) if error is not None else None
        item_.status = "completed" if error is None else "failed"
        out.status("response.mcp_call.completed" if error is None else "response.mcp_call.failed", item_.id, index)
    out.item("done", index, item_)
