"""Server-side MCP tools on a chat-template model, through the real server and the official client: the
server's tools are listed in the template's tool list as `LABEL.NAME`, a forced call (constrained decoding
in the template's `<tool_call>` syntax) goes to the counting MCP test server exactly once, the result is
rendered back as the template's tool message, and a kill -9 after the result is logged never calls again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest
from cryptography.fernet import Fernet

from service.constraints.plan import plan_from_spec
from service.prompting.base import ItemDelta, ItemEnded, ItemStarted, PromptRequest
from service.prompting.chat_template import ChatTemplateFormat
from service.prompting.chat_template_tools import ToolCallTextParser, completion_grammar
from service.prompting.testing_tokenizer import write_tiny_chat_model_tokenizer
from tests.api_helpers import client_for
from tests.conftest import ServerProcess, new_sandbox_root
from tests.test_chat_template_model import chat_model_dir  # noqa: F401 (fixture)
from tests.test_server_tools import (
    SECRET,
    assert_openai_strict,
    assert_secret_absent,
    calls_to,
    error_body,
    force,
    kill_9_after_a_logged_result,
    kill_9_during_a_call,
    mcp_tool,
)
from tests.test_tools_mcp import McpServer, mcp_server  # noqa: F401 (fixture)


def test_tools_named_by_label_and_results_rendered_by_the_template(tmp_path: Path) -> None:
    write_tiny_chat_model_tokenizer(tmp_path)
    chat = ChatTemplateFormat(tmp_path)
    history: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "mcp_list_tools", "server_label": "counter", "tools": []},
        {"type": "mcp_call", "id": "mcp_1", "server_label": "counter", "name": "pick", "arguments": "{}",
         "output": "picked red", "error": None},
    ]  # fmt: skip
    tool = {"type": "mcp_function", "namespace": "counter", "name": "pick", "parameters": {"type": "object"}}
    text = chat.tokenizer.decode(chat.render(PromptRequest(items=history, tools=(tool,))))
    assert '"name": "counter.pick"' in text  # in the tool list
    assert '<tool_call>{"name": "counter.pick", "arguments": {}}</tool_call>' in text  # the call in history
    assert "<|im_start|>tool\npicked red<|im_end|>" in text  # and its result
    # The continuation after a call the model ended with <|im_end|>: the template's tool turn, then the
    # generation prompt; the same tokens every time (a resumed run rebuilds them).
    tokens = chat.tool_result_tokens("counter.pick", "picked red")
    assert chat.tokenizer.decode(tokens) == "\n<|im_start|>tool\npicked red<|im_end|>\n<|im_start|>assistant\n"
    assert tokens == chat.tool_result_tokens("counter.pick", "picked red")
    # An approval request is the call; a refusal is its result; an approved one ends the prompt at its turn.
    asked = [
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "mcp_approval_request", "id": "mcpr_1", "server_label": "counter", "name": "pick", "arguments": "{}"},
    ]
    refusal = {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": False, "reason": "no"}
    text = chat.tokenizer.decode(chat.render(PromptRequest(items=[*asked, refusal])))
    assert text.endswith("<|im_start|>tool\nThe user declined this call. Reason: no<|im_end|>\n<|im_start|>assistant\n")
    approving = PromptRequest(items=[*asked, {**refusal, "approve": True}])
    cut = chat.approved_call_prompt(approving, chat.render(approving))
    assert cut is not None and chat.tokenizer.decode(cut).endswith("</tool_call><|im_end|>")
    assert chat.approved_call_prompt(PromptRequest(items=[*asked, refusal]), chat.render(approving)) is None
    # The code interpreter: its call's body is the code; its history item renders as that call and its logs.
    parser = ToolCallTextParser()
    chunks = parser.feed(
        '<tool_call>{"name": "code_interpreter.python", "arguments": {"code": "print(1)"}}</tool_call>'
    )
    assert chunks == [ItemStarted("function_call", name="python"), ItemDelta("print(1)"), ItemEnded()]
    ran = {
        "type": "code_interpreter_call",
        "id": "ci_1",
        "code": "print(1)",
        "outputs": [{"type": "logs", "logs": "1"}],
    }
    text = chat.tokenizer.decode(chat.render(PromptRequest(items=[asked[0], ran], tools=({"type": "python"},))))
    assert '"name": "code_interpreter.python"' in text
    assert '<tool_call>{"name": "code_interpreter.python", "arguments": {"code": "print(1)"}}</tool_call>' in text
    assert "<|im_start|>tool\n1<|im_end|>" in text
    # Offered (not forced), an MCP tool's call is still constrained: a call or an answer, nothing after a call.
    plan = plan_from_spec([tool], {"tool_choice": "auto"})
    spec = completion_grammar(plan, chat.grammar_tokenizer())
    assert spec is not None and '"counter.pick"' in spec.source and "TEXT" in spec.source


def test_forced_mcp_call_round_trip(
    app_factory: Any,
    database_url: str,
    chat_model_dir: Path,  # noqa: F811
    mcp_server: McpServer,  # noqa: F811
) -> None:
    server: ServerProcess = app_factory(database_url, SERVICE_MODEL=str(chat_model_dir)).start()
    client = client_for(server.url)
    before = len(calls_to(mcp_server, "pick"))
    response = client.responses.create(
        input="pick a color",
        tools=[mcp_tool(mcp_server, authorization=SECRET, allowed_tools=["pick"])],
        tool_choice=force("pick"),
        max_tool_calls=1,
        max_output_tokens=60,
        extra_body={"seed": 7},
    )
    types = [item.type for item in response.output]
    assert types[0] == "mcp_list_tools" and types.count("mcp_call") == 1, response.output
    call = next(item for item in response.output if item.type == "mcp_call")
    made = calls_to(mcp_server, "pick")
    assert len(made) == before + 1  # exactly one call went out
    assert made[-1]["authorization"] == f"Bearer {SECRET}"
    assert made[-1]["idempotency_key"] == f"{response.id}:tool:0"
    assert call.name == "pick" and call.server_label == "counter" and call.status == "completed"
    assert call.error is None and call.output == f"picked {made[-1]['arguments']['color']}", call
    events = [e["type"] for e in assert_openai_strict(server.url, response.id)]
    assert events.index("response.mcp_call_arguments.done") < events.index("response.mcp_call.completed")
    # The model went on after the result (max_tool_calls reached: it can only answer).
    assert types.index("mcp_call") < len(types) - 1 and types[-1] == "message", types
    # A follow-up turn renders the call from history and does not list again.
    follow = client.responses.create(
        input="and now?",
        previous_response_id=response.id,
        tools=[mcp_tool(mcp_server, allowed_tools=["pick"])],
        max_output_tokens=4,
    )
    assert follow.output and not any(item.type == "mcp_list_tools" for item in follow.output)
    # With a code interpreter, the label its tool name uses is reserved.
    interpreter: Any = {"type": "code_interpreter", "container": {"type": "auto"}}
    clash: Any = {**mcp_tool(mcp_server), "server_label": "code_interpreter"}
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(input="x", tools=[interpreter, clash])
    assert error_body(refused.value)["param"] == "tools[1].server_label"
    server.stop()
    assert_secret_absent(database_url)


def test_code_interpreter_round_trip(
    app_factory: Any,
    database_url: str,
    chat_model_dir: Path,  # noqa: F811
) -> None:
    # Bounded code (the random model never ends a string by itself); the sandbox dir must be reachable by its user.
    sandbox_dir = new_sandbox_root()
    env = {
        "SERVICE_MODEL": str(chat_model_dir),
        "SERVICE_CODE_INTERPRETER_MAX_CODE_CHARS": "30",
        "SERVICE_SANDBOX_DIR": str(sandbox_dir / "c"),
    }
    server: ServerProcess = app_factory(database_url, **env).start()
    client = client_for(server.url)
    response = client.responses.create(
        input="compute something",
        tools=[{"type": "code_interpreter", "container": {"type": "auto"}}],
        tool_choice="required",
        max_tool_calls=1,
        max_output_tokens=80,
        include=["code_interpreter_call.outputs"],
        extra_body={"seed": 3},
    )
    calls = [item for item in response.output if item.type == "code_interpreter_call"]
    assert len(calls) == 1, response.output
    call = calls[0]
    assert call.status == "completed" and call.code is not None and len(call.code) <= 30
    assert call.outputs is not None and call.outputs[0].type == "logs"
    assert (sandbox_dir / "c" / call.container_id).is_dir(), "the code ran in its container's work directory"
    types = [e["type"] for e in assert_openai_strict(server.url, response.id)]
    assert types.index("response.code_interpreter_call_code.done") < types.index(
        "response.code_interpreter_call.completed"
    )
    assert response.output[-1].type == "message"  # the model went on after the result
    # The next turn renders the call (its code and logs) from history.
    follow = client.responses.create(input="and?", previous_response_id=response.id, max_output_tokens=4)
    assert follow.status in ("completed", "incomplete")
    server.stop()


def test_approval_request_then_approve_or_refuse(
    app_factory: Any,
    database_url: str,
    chat_model_dir: Path,  # noqa: F811
    mcp_server: McpServer,  # noqa: F811
) -> None:
    server: ServerProcess = app_factory(database_url, SERVICE_MODEL=str(chat_model_dir)).start()
    client = client_for(server.url)
    tool = mcp_tool(mcp_server, require_approval="always", allowed_tools=["pick"])
    before = len(calls_to(mcp_server, "pick"))
    asked = client.responses.create(input="pick", tools=[tool], tool_choice=force("pick"), max_output_tokens=60)
    request = asked.output[-1]
    assert request.type == "mcp_approval_request" and request.name == "pick", asked.output
    assert len(calls_to(mcp_server, "pick")) == before, "nothing is called before it is approved"
    approved = client.responses.create(
        previous_response_id=asked.id,
        input=[{"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}],
        tools=[tool],
        max_output_tokens=20,
    )
    call = next(item for item in approved.output if item.type == "mcp_call")
    assert (call.name, call.arguments, call.approval_request_id) == ("pick", request.arguments, request.id)
    assert call.output == f"picked {json.loads(request.arguments)['color']}"
    assert len(calls_to(mcp_server, "pick")) == before + 1, "exactly the approved call"
    assert approved.output[-1].type == "message", approved.output  # the model went on after the result
    assert_openai_strict(server.url, approved.id)
    refused = client.responses.create(
        previous_response_id=asked.id,
        input=[{"type": "mcp_approval_response", "approval_request_id": request.id, "approve": False}],
        tools=[tool],
        tool_choice="none",
        max_output_tokens=10,
    )
    assert not any(item.type == "mcp_call" for item in refused.output)
    assert len(calls_to(mcp_server, "pick")) == before + 1
    server.stop()


def test_kill_9_after_a_logged_result_never_calls_again(
    server_factory: Any,
    database_url: str,
    chat_model_dir: Path,  # noqa: F811
    mcp_server: McpServer,  # noqa: F811
) -> None:
    env = {"SERVICE_MODEL": str(chat_model_dir), "SERVICE_SECRET_KEY": Fernet.generate_key().decode()}
    tool = mcp_tool(mcp_server, authorization=SECRET, allowed_tools=["pick"])
    kill_9_after_a_logged_result(server_factory, database_url, mcp_server, env, tool, tokens=200)


def test_kill_9_during_a_call_retries_it_once_with_its_key(
    server_factory: Any,
    database_url: str,
    chat_model_dir: Path,  # noqa: F811
    mcp_server: McpServer,  # noqa: F811
) -> None:
    env = {"SERVICE_MODEL": str(chat_model_dir)}
    final = kill_9_during_a_call(
        server_factory, database_url, mcp_server, env, mcp_tool(mcp_server, allowed_tools=["nap"])
    )
    assert final.output[-1].type == "message"  # the model went on after the retried call's result
