"""LangChain's `ChatOpenAI(use_responses_api=True)`, unmodified, against the real server (issue 38): `invoke`,
`stream`, `bind_tools` with a forced tool and a ToolMessage round trip, `reasoning={"effort", "summary"}`.

The server serves the scripted model of tests/client_helpers.py; every request is bounded by `max_tokens`
(sent as `max_output_tokens`). Needs the pinned clients (tests/clients-requirements.txt): `.ci/run` installs
them in their own venv (.venv-clients) and runs this file there; the default .venv run skips it with a message.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.api_helpers import client_for
from tests.client_helpers import BOUND, HELLO, MODEL, TOOL, TOOL_ANSWER, output_text, scripted_server, stored
from tests.conftest import ServerProcess

pytest.importorskip(
    "langchain_openai", reason="langchain-openai is not installed: run in the clients venv (.venv-clients; .ci/run)"
)

from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from scripted_server(tmp_path_factory.mktemp("langchain"))


def _chat(server: ServerProcess, **options: Any) -> ChatOpenAI:
    settings: dict[str, Any] = {
        "model": MODEL,
        "base_url": server.url + "/v1",
        "api_key": "sk-test",
        "use_responses_api": True,
        "max_tokens": BOUND,  # sent as max_output_tokens
        "max_retries": 0,
    }
    return ChatOpenAI(**settings, **options)


def _response_id(message: AIMessage | AIMessageChunk) -> str:
    response_id = message.response_metadata.get("id") or message.id
    assert isinstance(response_id, str) and response_id.startswith("resp_"), message
    return response_id


@tool(TOOL)
def lookup() -> str:
    """Looks something up."""
    return "found"


def test_invoke_returns_the_stored_response(server: ServerProcess) -> None:
    message = _chat(server).invoke("Say hello")
    response = stored(server, _response_id(message))
    assert response["status"] == "completed" and response["max_output_tokens"] == BOUND
    assert message.text == output_text(response) == HELLO
    assert message.usage_metadata is not None
    assert message.usage_metadata["output_tokens"] == response["usage"]["output_tokens"]
    assert message.usage_metadata["input_tokens"] == response["usage"]["input_tokens"]


def test_stream_text_is_the_final_text(server: ServerProcess) -> None:
    chunks = list(_chat(server).stream("Say hello"))
    assert len(chunks) > 2
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    response = stored(server, _response_id(merged))
    assert merged.text == output_text(response) == HELLO


def test_bind_tools_forced_call_and_tool_message_round_trip(server: ServerProcess) -> None:
    chat = _chat(server)
    question = HumanMessage("Look it up")
    call_message = chat.bind_tools([lookup], tool_choice=TOOL).invoke([question])
    assert [call["name"] for call in call_message.tool_calls] == [TOOL]
    call = call_message.tool_calls[0]
    assert call["args"] == {}
    response = stored(server, _response_id(call_message))
    assert response["tool_choice"] == {"type": "function", "name": TOOL}
    assert [item["call_id"] for item in response["output"] if item["type"] == "function_call"] == [call["id"]]

    result = lookup.invoke(call)
    assert isinstance(result, ToolMessage) and result.content == "found"
    answer = chat.bind_tools([lookup]).invoke([question, call_message, result])
    assert answer.text == TOOL_ANSWER and not answer.tool_calls
    # the second request carried the question, the call and its output as input items
    second = _response_id(answer)
    assert stored(server, second)["status"] == "completed"
    items = client_for(server.url).responses.input_items.list(second, order="asc").data
    assert [item.type for item in items] == ["message", "function_call", "function_call_output"]
    assert items[2].model_dump()["call_id"] == call["id"] and items[2].model_dump()["output"] == "found"


def test_reasoning_summary_and_effort(server: ServerProcess) -> None:
    message = _chat(server, reasoning={"effort": "low", "summary": "auto"}).invoke("Think, then say hello")
    response = stored(server, _response_id(message))
    assert response["reasoning"]["effort"] == "low" and response["reasoning"]["summary"] == "auto"
    assert [item["type"] for item in response["output"]] == ["reasoning", "message"]
    assert message.text == HELLO
    blocks = [block for block in message.content if isinstance(block, dict) and block.get("type") == "reasoning"]
    assert len(blocks) == 1, message.content
    # the summary LangChain hands back is the stored one, a non-empty list of summary_text parts
    assert blocks[0]["summary"] == response["output"][0]["summary"]
    assert blocks[0]["summary"] and all(part["type"] == "summary_text" for part in blocks[0]["summary"])
