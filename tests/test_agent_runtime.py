"""The agent loop's interfaces: the server's tools (`ToolRuntime`, `McpSecrets`) built once and shared, the
capabilities a `ChatFormat` declares (with their "unsupported" defaults). That the package never imports the run
loop that drives it is tests/test_import_graph.py's."""

from __future__ import annotations

from typing import Any

import pytest

from service.agent import setup
from service.agent.runtime import McpSecrets, ToolRuntime
from service.agent.steps import result_tokens_for
from service.config import Settings
from service.errors import InvalidRequest
from service.model_runtime import ModelRuntime
from service.prompting import harmony_tools
from service.prompting.base import PromptRequest
from service.prompting.harmony import HarmonyFormat
from service.tools.mcp_policy import McpAddressPolicy
from tests.doubles import CharFormat, ScriptedEngine

MCP: dict[str, Any] = {"type": "mcp", "server_label": "counter", "server_url": "http://127.0.0.1:1/mcp"}
HEADERS = {"Authorization": "Bearer sk-x"}


def test_mcp_secrets_are_kept_per_response_until_popped() -> None:
    secrets = McpSecrets()
    secrets.put("resp_a", {"counter": HEADERS})
    assert secrets.get("resp_a", "counter") == HEADERS
    assert secrets.get("resp_a", "other") is None and secrets.get("resp_b", "counter") is None
    secrets.pop("resp_a")
    secrets.pop("resp_a")  # popping twice (a refused create, then the run's end) is harmless
    assert secrets.get("resp_a", "counter") is None


def test_the_tool_runtime_is_built_from_settings() -> None:
    settings = Settings(tool_timeout_seconds=7.0)
    bare = ToolRuntime.build(settings)
    assert bare.connector.timeout_seconds == 7.0 and bare.containers is None and bare.sandbox_unavailable is None
    assert bare.connector.policy == McpAddressPolicy()  # a loopback development server's
    policy = McpAddressPolicy(("mcp.example.com",), "0.0.0.0")
    served = ToolRuntime.build(settings, policy=policy, sandbox_unavailable="no bubblewrap")
    assert served.connector.policy is policy and served.sandbox_unavailable == "no bubblewrap"
    assert served.secrets is not bare.secrets  # each runtime its own


async def test_a_reserved_server_label_is_refused_beside_the_code_interpreter() -> None:
    runtime = ToolRuntime.build(Settings())
    interpreter: dict[str, Any] = {"type": "code_interpreter", "container": {"type": "auto"}}
    clash = {**MCP, "server_label": "code_interpreter"}
    with pytest.raises(InvalidRequest) as refused:
        await setup.prepare(
            [interpreter, clash],
            runtime,
            history=[],
            input_items=[],
            background=False,
            project="p",
            reserved_labels=frozenset({"code_interpreter"}),
        )
    assert refused.value.param == "tools[1].server_label" and "'code_interpreter'" in refused.value.message


def test_a_format_without_capabilities_declares_them_unsupported() -> None:
    chars = CharFormat()
    request = PromptRequest(items=[])
    assert chars.grammar_tokenizer() is None and chars.reserved_server_labels == frozenset()
    assert chars.approved_call_prompt(request, [1, 2, 3]) is None
    with pytest.raises(NotImplementedError, match="not supported by the chars format"):
        chars.server_tool_result_tokens("counter", "pick", "red")
    runtime = ModelRuntime("scripted", ScriptedEngine("ok"), chars)
    # No grammar: a request that constrains content is refused, one that does not passes.
    spec = {"tool_choice": "auto", "text_format": {"type": "json_object"}, "max_tool_calls": None}
    with pytest.raises(InvalidRequest) as refused:
        runtime.check_constraints(request, spec)
    assert refused.value.param == "text.format" and refused.value.code == "unsupported_value"
    runtime.check_constraints(request, {**spec, "text_format": None})
    assert runtime.new_constraint(request, spec) is None  # the format's own new_constraint()


def test_harmony_declares_the_agent_loops_capabilities() -> None:
    fmt = HarmonyFormat()
    assert fmt.grammar_tokenizer() is not None and fmt.reserved_server_labels == frozenset()
    text = harmony_tools.result_text(None, "boom")
    expected = harmony_tools.tool_result_tokens(fmt.encoding, "counter.pick", text)
    assert result_tokens_for(fmt)("counter", "pick", None, "boom") == expected
    assert fmt.server_tool_result_tokens("python", "", "4") == harmony_tools.tool_result_tokens(
        fmt.encoding, "python", "4"
    )
    call = "<|start|>assistant<|channel|>commentary to=counter.pick<|message|>{}<|call|>"
    prompt = list(fmt.encoding.encode(call + "<|start|>assistant", allowed_special="all"))
    cut = fmt.approved_call_prompt(PromptRequest(items=[]), prompt)
    assert cut == list(fmt.encoding.encode(call, allowed_special="all"))
    assert fmt.approved_call_prompt(PromptRequest(items=[]), prompt[:-1]) is None
