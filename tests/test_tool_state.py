"""The pure parts of server-side tool calls in a response: which recipient is a server call, the items and
events the StreamBuilder makes of one, and the segment bookkeeping a resumed run rebuilds."""

from __future__ import annotations

from typing import Any

from service.agent.calls import ToolCalls
from service.agent.items import classify
from service.agent.segment import Segment, segment_constraint_spec
from service.prompting.base import ItemDelta, ItemEnded, ItemStarted
from service.stream_builder import StreamBuilder

MCP = {"type": "mcp", "server_label": "counter", "server_url": "http://127.0.0.1:1/mcp", "require_approval": "never"}
CODE = {"type": "code_interpreter", "container": {"type": "auto"}}


def builder(*tools: dict[str, Any]) -> StreamBuilder:
    return StreamBuilder({"id": "resp_" + "a" * 48, "status": "in_progress", "output": [], "tools": list(tools)})


def test_classify_recipients() -> None:
    assert classify("counter.pick", [MCP]) is not None and classify("counter.pick", [MCP]).kind == "mcp_call"  # type: ignore[union-attr]
    assert classify("other.pick", [MCP]) is None  # not a server of this request: a client function call
    assert classify("pick", [MCP]) is None
    assert classify("python", [CODE]) is not None and classify("python", []) is None
    always = {**MCP, "require_approval": "always"}
    assert classify("counter.pick", [always]).kind == "mcp_approval_request"  # type: ignore[union-attr]
    never_pick = {**MCP, "require_approval": {"never": {"tool_names": ["pick"]}}}
    assert classify("counter.pick", [never_pick]).kind == "mcp_call"  # type: ignore[union-attr]
    assert classify("counter.shout", [never_pick]).kind == "mcp_approval_request"  # type: ignore[union-attr]


def test_mcp_call_waits_for_its_result() -> None:
    b = builder(MCP)
    events = b.feed([ItemStarted("function_call", name="counter.pick")])
    events += b.feed([ItemDelta('{"color": "red"}')])
    events += b.feed([ItemEnded()])
    assert [e["type"] for e in events] == [
        "response.output_item.added",
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
    ]
    assert b.pending_call is not None and b.pending_call["status"] == "calling"
    done = b.tool_result("picked red", None)
    assert [e["type"] for e in done] == ["response.mcp_call.completed", "response.output_item.done"]
    item = done[-1]["item"]
    assert (item["output"], item["error"], item["status"], item["arguments"]) == (
        "picked red",
        None,
        "completed",
        '{"color": "red"}',
    )
    assert b.pending_call is None
    failed = builder(MCP)
    failed.feed([ItemStarted("function_call", name="counter.pick"), ItemDelta("{}"), ItemEnded()])
    events = failed.tool_result(None, "boom")
    assert events[0]["type"] == "response.mcp_call.failed"
    assert events[-1]["item"]["error"] == {"type": "mcp_protocol_error", "code": -32000, "message": "boom"}


def test_code_interpreter_call_and_a_run_ending_mid_call() -> None:
    b = builder(CODE)
    events = b.feed([ItemStarted("function_call", name="python"), ItemDelta("print(42)"), ItemEnded()])
    assert [e["type"] for e in events][-2:] == [
        "response.code_interpreter_call_code.done",
        "response.code_interpreter_call.interpreting",
    ]
    end = b.finish("cancelled", input_tokens=1, output_tokens=1)
    assert end[0]["type"] == "response.output_item.done" and end[0]["item"]["status"] == "incomplete"
    assert end[-1]["response"]["output"][0]["type"] == "code_interpreter_call"
    ok = builder(CODE)
    ok.feed([ItemStarted("function_call", name="python"), ItemDelta("print(42)"), ItemEnded()])
    item = ok.tool_result("42\n", None, {"exit_code": 0})[-1]["item"]
    assert item["outputs"] == [{"type": "logs", "logs": "42\n"}] and item["status"] == "completed"
    assert item["container_id"] == "cntr_" + "a" * 48


def test_approval_request_ends_without_waiting() -> None:
    b = builder({**MCP, "require_approval": "always"})
    events = b.feed([ItemStarted("function_call", name="counter.pick"), ItemDelta("{}"), ItemEnded()])
    assert [e["type"] for e in events] == ["response.output_item.added", "response.output_item.done"]
    assert events[-1]["item"] == {
        "id": events[-1]["item"]["id"],
        "type": "mcp_approval_request",
        "server_label": "counter",
        "name": "pick",
        "arguments": "{}",
    }
    assert b.pending_call is None


def test_segments_and_their_constraint_specs() -> None:
    segment = Segment([1, 2, 3], calls=ToolCalls("resp_x", 2))
    segment.tokens += [4, 5]
    segment.next_segment([6, 7])
    assert (segment.prompt, segment.tokens, segment.generated_before, segment.calls_made) == (
        [1, 2, 3, 4, 5, 6, 7],
        [],
        2,
        1,
    )
    spec = {"tool_choice": {"type": "mcp", "server_label": "counter"}, "max_tool_calls": 2, "text_format": None}
    assert segment_constraint_spec(spec, 0) is spec
    assert segment_constraint_spec(spec, 1) == {**spec, "tool_choice": "auto", "max_tool_calls": 1}
    assert segment_constraint_spec(spec, 3)["max_tool_calls"] == 0  # type: ignore[index]
    assert segment_constraint_spec({**spec, "tool_choice": "none"}, 1)["tool_choice"] == "none"  # type: ignore[index]


async def test_secrets_held_elsewhere_are_an_error_not_an_unauthenticated_call() -> None:
    from cryptography.fernet import Fernet

    from service.agent.runtime import ToolRuntime
    from service.agent.steps import ToolSteps
    from service.config import Settings
    from service.log.facts import RequestFact, Sampling
    from service.prompting.harmony import HarmonyFormat
    from service.runs.state import ActiveRun
    from service.tools import secrets

    key = Fernet.generate_key().decode()
    steps = ToolSteps(ToolRuntime.build(Settings(secret_key=key)), HarmonyFormat())
    spec = {**MCP, "authorization": "sk-x"}

    def run_with(**fields: Any) -> ActiveRun:
        response = {"id": "resp_" + "b" * 48, "tools": [secrets.redact(spec)]}
        sampling = Sampling(max_new_tokens=16, temperature=1.0, top_p=1.0, seed=1, top_logprobs=0)
        fact = RequestFact(
            request={},
            response=response,
            prompt_items=[],
            instructions=None,
            tools=[],
            reasoning_effort="medium",
            prompt_token_ids=[],
            input_item_count=0,
            store=True,
            sampling=sampling,
            **fields,
        )
        return ActiveRun("resp_" + "b" * 48, fact, builder(), None, {}, 0)  # type: ignore[arg-type]

    held_elsewhere = steps.registry(run_with(mcp_secret_labels=["counter"])).get("counter")
    assert held_elsewhere is not None
    result = await held_elsewhere.call("pick", "{}", "k")
    assert result.output is None and result.error is not None and "SERVICE_SECRET_KEY" in result.error
    sealed = run_with(mcp_secret_labels=["counter"], sealed_secrets={"counter": secrets.seal(key, spec)})
    assert steps._headers(sealed, "counter") == {"Authorization": "Bearer sk-x"}
    steps.tools.secrets.put("resp_" + "b" * 48, {"counter": {"Authorization": "Bearer mem"}})
    assert steps._headers(run_with(mcp_secret_labels=["counter"]), "counter") == {"Authorization": "Bearer mem"}
