"""The OpenAI Agents SDK, unmodified, against the real server (issue 38): `Runner.run` plain and with a forced
tool, `Runner.run_streamed`, `previous_response_id`, `conversation_id`, `store=False` + `to_input_list()`,
`Reasoning(effort="low", summary="auto")` and the WebSocket transport (`OpenAIResponsesWSModel`).

The server serves the scripted model of tests/client_helpers.py (the SDK raises on an `incomplete` response, and
the random model never stops by itself); every run still bounds `max_tokens` (the SDK's `max_output_tokens`) and
the tool run forces the call with `tool_choice`. Needs the pinned clients
(tests/clients-requirements.txt): `.ci/run` installs them in their own venv (.venv-clients) and runs this file
there; the default .venv run skips it with a message.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.api_helpers import client_for
from tests.client_helpers import BOUND, HELLO, MODEL, TOOL, output_text, scripted_server, stored
from tests.conftest import ServerProcess

agents = pytest.importorskip(
    "agents", reason="openai-agents is not installed: run in the clients venv (.venv-clients; .ci/run)"
)

import openai  # noqa: E402
from agents import (  # noqa: E402  (after the importorskip above)
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    responses_websocket_session,
    set_tracing_disabled,
)
from agents.models.openai_responses import OpenAIResponsesWSModel  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402
from openai.types.shared import Reasoning  # noqa: E402

set_tracing_disabled(True)  # no exporter: nothing may leave the test machine


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from scripted_server(tmp_path_factory.mktemp("agents-sdk"))


def _model(server: ServerProcess, *, websocket: bool = False) -> OpenAIResponsesModel:
    client = AsyncOpenAI(base_url=server.url + "/v1", api_key="sk-test", max_retries=0)
    if websocket:
        return OpenAIResponsesWSModel(model=MODEL, openai_client=client)
    return OpenAIResponsesModel(model=MODEL, openai_client=client)


def _agent(server: ServerProcess, *, websocket: bool = False, **settings: Any) -> Agent[Any]:
    return Agent(
        name="assistant",
        instructions="Answer briefly.",
        model=_model(server, websocket=websocket),
        model_settings=ModelSettings(max_tokens=BOUND, **settings),
    )


async def test_run_returns_the_stored_response(server: ServerProcess) -> None:
    result = await Runner.run(_agent(server), "Say hello")
    response_id = result.last_response_id
    assert response_id is not None and response_id.startswith("resp_")
    response = stored(server, response_id)
    assert response["status"] == "completed" and response["model"] == MODEL
    assert response["max_output_tokens"] == BOUND and response["instructions"] == "Answer briefly."
    assert result.final_output == output_text(response) == HELLO
    usage = result.raw_responses[-1].usage
    assert (usage.input_tokens, usage.output_tokens) == (
        response["usage"]["input_tokens"],
        response["usage"]["output_tokens"],
    )


async def test_forced_tool_is_called_and_run(server: ServerProcess) -> None:
    calls: list[str] = []

    @function_tool(name_override=TOOL)
    def lookup() -> str:
        """Looks something up."""
        calls.append(TOOL)
        return "found"

    agent = _agent(server, tool_choice=TOOL).clone(
        tools=[lookup],
        tool_use_behavior="stop_on_first_tool",  # the tool's output is the final output: no second model call
    )
    result = await Runner.run(agent, "Look it up", max_turns=2)
    assert calls == [TOOL]
    assert result.final_output == "found"
    response = stored(server, str(result.last_response_id))
    assert response["status"] == "completed"
    assert [item["name"] for item in response["output"] if item["type"] == "function_call"] == [TOOL]
    assert response["tool_choice"] == {"type": "function", "name": TOOL}


async def test_forced_tool_then_answer_in_a_second_turn(server: ServerProcess) -> None:
    """Without stop_on_first_tool the SDK sends the tool's output back (a second request) and takes the answer;
    tool_choice="auto" on the second call lets the model answer (reset_tool_choice, the SDK's default)."""

    @function_tool(name_override=TOOL)
    def lookup() -> str:
        """Looks something up."""
        return "found"

    agent = _agent(server, tool_choice=TOOL).clone(tools=[lookup])
    result = await Runner.run(agent, "Look it up", max_turns=3)
    assert len(result.raw_responses) == 2
    assert result.final_output == output_text(stored(server, str(result.last_response_id)))
    items: list[dict[str, Any]] = [dict(item) for item in result.to_input_list()]
    assert [item["output"] for item in items if item.get("type") == "function_call_output"] == ["found"]


async def test_run_streamed_text_is_the_final_text(server: ServerProcess) -> None:
    result = Runner.run_streamed(_agent(server), "Say hello")
    deltas: list[str] = []
    types: list[str] = []
    async for event in result.stream_events():
        if event.type == "raw_response_event":
            types.append(event.data.type)
            if event.data.type == "response.output_text.delta":
                deltas.append(event.data.delta)
    assert types[0] == "response.created" and types[-1] == "response.completed"
    response = stored(server, str(result.last_response_id))
    assert "".join(deltas) == output_text(response) == result.final_output == HELLO
    assert len(deltas) > 1


async def test_previous_response_id_chains_turns(server: ServerProcess) -> None:
    first = await Runner.run(_agent(server), "My name is Ada")
    second = await Runner.run(_agent(server), "What is my name?", previous_response_id=first.last_response_id)
    first_response = stored(server, str(first.last_response_id))
    second_response = stored(server, str(second.last_response_id))
    assert second_response["previous_response_id"] == first.last_response_id
    # the second turn's prompt holds the first turn: more input tokens than the first prompt
    assert second_response["usage"]["input_tokens"] > first_response["usage"]["input_tokens"]
    items = client_for(server.url).responses.input_items.list(str(second.last_response_id), order="asc").data
    assert [item.type for item in items] == ["message"]  # only the new input: the rest is the chain


async def test_conversation_id_appends_both_turns(server: ServerProcess) -> None:
    client = client_for(server.url)
    conversation = client.conversations.create()
    first = await Runner.run(_agent(server), "My name is Ada", conversation_id=conversation.id)
    second = await Runner.run(_agent(server), "What is my name?", conversation_id=conversation.id)
    for result in (first, second):
        assert stored(server, str(result.last_response_id))["conversation"] == {"id": conversation.id}
    items = [item.model_dump() for item in client.conversations.items.list(conversation.id, order="asc").data]
    texts = [(item["role"], part["text"]) for item in items if item["type"] == "message" for part in item["content"]]
    assert texts == [
        ("user", "My name is Ada"),
        ("assistant", HELLO),
        ("user", "What is my name?"),
        ("assistant", HELLO),
    ]


async def test_store_false_and_to_input_list_carry_the_history(server: ServerProcess) -> None:
    agent = _agent(server, store=False)
    first = await Runner.run(agent, "My name is Ada")
    history = first.to_input_list()
    assert history[0] == {"content": "My name is Ada", "role": "user"}
    second = await Runner.run(agent, [*history, {"role": "user", "content": "What is my name?"}])
    assert first.final_output == second.final_output == HELLO
    first_usage, second_usage = first.raw_responses[-1].usage, second.raw_responses[-1].usage
    assert second_usage.input_tokens > first_usage.input_tokens  # the first turn is in the second prompt
    # nothing was stored: a GET of either id is a 404
    for result in (first, second):
        with pytest.raises(openai.NotFoundError):
            stored(server, str(result.last_response_id))


async def test_reasoning_effort_and_summary(server: ServerProcess) -> None:
    agent = _agent(server, reasoning=Reasoning(effort="low", summary="auto"))
    result = await Runner.run(agent, "Think, then say hello")
    response = stored(server, str(result.last_response_id))
    assert response["status"] == "completed"
    assert response["reasoning"]["effort"] == "low" and response["reasoning"]["summary"] == "auto"
    assert [item["type"] for item in response["output"]] == ["reasoning", "message"]
    assert result.final_output == HELLO
    reasoning = [item for item in result.new_items if item.type == "reasoning_item"]
    assert len(reasoning) == 1


async def test_websocket_transport_runs_streams_and_chains(server: ServerProcess) -> None:
    agent = _agent(server, websocket=True)
    model = agent.model
    assert isinstance(model, OpenAIResponsesWSModel)
    try:
        first = await Runner.run(agent, "Say hello")
        streamed = Runner.run_streamed(agent, "Say it again", previous_response_id=first.last_response_id)
        deltas = [
            event.data.delta
            async for event in streamed.stream_events()
            if event.type == "raw_response_event" and event.data.type == "response.output_text.delta"
        ]
        assert model._ws_connection is not None  # both runs went over the socket (no HTTP fallback)
    finally:
        await model.close()
    assert first.final_output == output_text(stored(server, str(first.last_response_id))) == HELLO
    second = stored(server, str(streamed.last_response_id))
    assert second["previous_response_id"] == first.last_response_id
    assert "".join(deltas) == output_text(second) == streamed.final_output == HELLO


async def test_websocket_session_helper_with_store_false(server: ServerProcess) -> None:
    """`responses_websocket_session`, the SDK's documented way to keep one socket across runs: with store=False
    the second run continues from the first on the same connection (the connection keeps its responses)."""
    async with responses_websocket_session(base_url=server.url + "/v1", api_key="sk-test") as session:
        agent = Agent(
            name="assistant",
            model=MODEL,
            model_settings=ModelSettings(max_tokens=BOUND, store=False),
        )
        first = await session.run(agent, "My name is Ada")
        second = await session.run(agent, "What is my name?", previous_response_id=first.last_response_id)
    assert first.final_output == second.final_output == HELLO
    # the first turn is in the second prompt: over HTTP, previous_response_id of a store=False response is a 404,
    # so this also shows both runs went over one socket
    first_usage, second_usage = first.raw_responses[-1].usage, second.raw_responses[-1].usage
    assert second_usage.input_tokens > first_usage.input_tokens
    with pytest.raises(openai.NotFoundError):  # never visible over HTTP
        stored(server, str(second.last_response_id))
