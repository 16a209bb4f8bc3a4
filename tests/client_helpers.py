"""What the real-client tests (tests/test_client_*.py) share: a scripted model whose answers end by
themselves, and a module-scoped server on it.

The built-in random model never stops by itself, and the Agents SDK and LangChain treat an `incomplete`
response as an error, so these tests serve a scripted decoder (service/engine/scripted.py): the server, its
protocol, log, constrained decoding and store are the real ones, only the tokens follow the rules below.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from service.engine.scripted import Rule, write_scripted_model
from tests.api_helpers import client_for
from tests.conftest import ServerProcess, app_on_backend

MODEL = "scripted"
BOUND = 64  # max output tokens in every request: far above each script, a bound should a script go astray
HELLO = "Hello! How can I help you today?"
THOUGHT = "Let me think."
TOOL_ANSWER = "The tool answered."
TOOL = "lookup"

# First match wins. A prompt that holds a tool call (a round trip's second turn) gets the tool answer; a prompt
# with "Think" reasons first (the script ends in <|start|>, so the next rule is picked with the analysis in the
# sequence: the answer); "Look it up" calls the tool (with "{}": the tool takes no arguments); anything else
# is the greeting.
RULES = [
    Rule(f"<|channel|>final<|message|>{TOOL_ANSWER}<|return|>", ["<|call|>"]),
    Rule(f"<|channel|>final<|message|>{HELLO}<|return|>", [THOUGHT]),
    Rule(f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>", ["Think"]),
    Rule(f"<|channel|>commentary to=functions.{TOOL} <|constrain|>json<|message|>{{}}<|call|>", ["Look it up"]),
    Rule(f"<|channel|>final<|message|>{HELLO}<|return|>"),
]


def scripted_server(tmp: Path) -> Iterator[ServerProcess]:
    """The body of a module-scoped `server` fixture: a server on SQLite serving RULES as model MODEL."""
    model = write_scripted_model(tmp / "scripted-model", RULES, model_id=MODEL)
    yield from app_on_backend("sqlite", tmp, SERVICE_MODEL=str(model))


def stored(server: ServerProcess, response_id: str) -> dict[str, Any]:
    """The response as GET /v1/responses/{id} returns it."""
    return client_for(server.url).responses.retrieve(response_id).model_dump()


def output_text(response: dict[str, Any]) -> str:
    return "".join(
        part["text"]
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )
