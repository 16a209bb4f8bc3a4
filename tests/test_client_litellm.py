"""LiteLLM's `responses()`, unmodified, against the real server (issue 38): plain, streaming, a forced function
tool with its output sent back on `previous_response_id`, and `reasoning={"effort", "summary"}`.

The server serves the scripted model of tests/client_helpers.py; every request is bounded by
`max_output_tokens`. Needs the pinned clients (tests/clients-requirements.txt): `.ci/run` installs them in their
own venv (.venv-clients) and runs this file there; the default .venv run skips it with a message.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.api_helpers import client_for
from tests.client_helpers import BOUND, HELLO, MODEL, TOOL, TOOL_ANSWER, output_text, scripted_server, stored
from tests.conftest import ServerProcess

# The machine is offline: LiteLLM's bundled model cost map, not three retried downloads on import.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
litellm = pytest.importorskip(
    "litellm", reason="litellm is not installed: run in the clients venv (.venv-clients; .ci/run)"
)

from litellm.responses.utils import ResponsesAPIRequestUtils  # noqa: E402

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": TOOL,
        "description": "Looks something up.",
        "parameters": {"type": "object", "properties": {}, "required": [], "additionalProperties": False},
        "strict": True,
    }
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from scripted_server(tmp_path_factory.mktemp("litellm"))


def _responses(server: ServerProcess, **request: Any) -> Any:
    return litellm.responses(
        model=f"openai/{MODEL}",  # the openai/ prefix: LiteLLM's OpenAI provider, pointed at api_base
        api_base=server.url + "/v1",
        api_key="sk-test",
        max_output_tokens=BOUND,
        max_retries=0,
        **request,
    )


def _server_id(litellm_id: str) -> str:
    """The server's response id: a non-streamed response's id from LiteLLM is `resp_` + base64 of its provider,
    deployment and the server's id (decoded again when sent back as previous_response_id); a streamed one's is the
    server's own. Decoding leaves an id that is not LiteLLM's as it is."""
    response_id = str(ResponsesAPIRequestUtils.decode_responses_api_response_id(litellm_id)["response_id"])
    assert response_id.startswith("resp_")
    return response_id


def test_responses_returns_the_stored_response(server: ServerProcess) -> None:
    response = _responses(server, input="Say hello")
    assert response.id.startswith("resp_") and response.status == "completed"
    assert _server_id(response.id) != response.id  # LiteLLM's own encoding of the server's id
    again = stored(server, _server_id(response.id))
    assert again["status"] == "completed" and again["max_output_tokens"] == BOUND and again["model"] == MODEL
    assert output_text(response.model_dump()) == output_text(again) == HELLO
    assert response.usage.output_tokens == again["usage"]["output_tokens"]


def test_streamed_text_is_the_final_text(server: ServerProcess) -> None:
    events = list(_responses(server, input="Say hello", stream=True))
    types = [event.type for event in events]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    final = events[-1].response
    assert deltas == output_text(stored(server, _server_id(final.id))) == HELLO
    assert final.status == "completed"


def test_forced_tool_and_its_output_on_previous_response_id(server: ServerProcess) -> None:
    first = _responses(server, input="Look it up", tools=TOOLS, tool_choice={"type": "function", "name": TOOL})
    calls = [item for item in first.output if item.type == "function_call"]
    assert [call.name for call in calls] == [TOOL] and calls[0].arguments == "{}"
    assert stored(server, _server_id(first.id))["tool_choice"] == {"type": "function", "name": TOOL}
    output = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "found"}
    second = _responses(server, input=[output], tools=TOOLS, previous_response_id=first.id)
    assert second.status == "completed"
    again = stored(server, _server_id(second.id))
    assert again["previous_response_id"] == _server_id(first.id)
    assert output_text(again) == output_text(second.model_dump()) == TOOL_ANSWER
    items = client_for(server.url).responses.input_items.list(_server_id(second.id)).data
    assert [item.type for item in items] == ["function_call_output"]


def test_reasoning_summary_and_effort(server: ServerProcess) -> None:
    response = _responses(server, input="Think, then say hello", reasoning={"effort": "low", "summary": "auto"})
    again = stored(server, _server_id(response.id))
    assert again["reasoning"]["effort"] == "low" and again["reasoning"]["summary"] == "auto"
    assert [item["type"] for item in again["output"]] == ["reasoning", "message"]
    assert output_text(response.model_dump()) == HELLO
