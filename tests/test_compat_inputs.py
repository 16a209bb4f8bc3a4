"""What OpenAI accepts is accepted (DESIGN.md "Compatibility rule"): hints and metadata real clients send on every
request (Codex CLI, the Agents SDK, LangChain, LiteLLM), compressed bodies, the input shapes OpenAI takes, and
tools this server does not run. Through the real server with the official client, each answer validated against
the SDK's strict types; the 400s kept name the right parameter. On SQLite and PostgreSQL."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import zstandard
from openai.types.responses import Response

from tests.api_helpers import client_for, sql_rows
from tests.conftest import ServerProcess, app_on_backend
from tests.test_conformance import OPENAI_ITEM, assert_response_conforms

ServerFactory = Callable[..., ServerProcess]
MAX_BODY = 200_000
CALL = {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{}"}
LOOKUP = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, random_model_dir: Path
) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp(f"compat-{request.param}")
    yield from app_on_backend(request.param, tmp, SERVICE_MAX_BODY_BYTES=str(MAX_BODY))


@pytest.fixture
def client(server: ServerProcess) -> openai.OpenAI:
    return client_for(server.url)


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


def _create(
    client: openai.OpenAI, *, open_responses: bool = True, **params: Any
) -> tuple[dict[str, Any], dict[str, str]]:
    """A create through the official client; its Response validated strictly against OpenAI's types and, where
    the Open Responses spec has the shapes asked for (`open_responses`: it knows only function tools, and no
    `minimal` effort), against its types too."""
    params["extra_body"] = {"seed": 1, **params.get("extra_body", {})}
    raw = client.responses.with_raw_response.create(max_output_tokens=4, **params)
    text, headers = raw.http_response.text, {name.lower(): value for name, value in raw.http_response.headers.items()}
    if open_responses:
        return assert_response_conforms(text), headers
    Response.model_validate_json(text, strict=True)
    return json.loads(text), headers


def _count(client: openai.OpenAI, **params: Any) -> int:
    return client.responses.input_tokens.count(**params).input_tokens


def _error(reply: httpx.Response, status: int) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    error: dict[str, Any] = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


# Hints and metadata


def test_hints_and_metadata_are_accepted_and_echoed(client: openai.OpenAI, server: ServerProcess) -> None:
    response, _ = _create(
        client,
        input="Say hello",
        reasoning={"effort": "low", "summary": "auto"},
        text={"verbosity": "low"},
        parallel_tool_calls=True,
        prompt_cache_key="codex-session-1",
        prompt_cache_retention="24h",
        safety_identifier="user-123",
        user="someone",
        service_tier="flex",
        store=True,
        top_logprobs=2,
        truncation="auto",
        extra_body={
            "client_metadata": {"session": "s1", "originator": "codex_cli_rs"},
            "background_options": {"completion_window": "soonest", "continuation_id": "c1"},
            "prompt_cache_options": {"mode": "implicit", "ttl": "30m"},
            "image": {"context_compression": "auto"},
        },
    )
    assert response["reasoning"] == {"effort": "low", "summary": "auto"}
    assert response["text"]["verbosity"] == "low"
    assert response["parallel_tool_calls"] is True
    assert response["prompt_cache_key"] == "codex-session-1" and response["prompt_cache_retention"] == "24h"
    assert response["safety_identifier"] == "user-123" and response["user"] == "someone"
    assert response["service_tier"] == "default"  # the tier that served it, as OpenAI reports it
    assert response["top_logprobs"] == 2 and response["truncation"] == "auto"
    assert "client_metadata" not in response  # OpenAI's Response has no such field
    (data,) = sql_rows(
        server.database_url, f"SELECT data FROM run_facts WHERE response_id = '{response['id']}' AND kind = 'request'"
    )[0]
    assert json.loads(data)["request"]["client_metadata"] == {"session": "s1", "originator": "codex_cli_rs"}


def test_client_metadata_never_reaches_the_model(client: openai.OpenAI) -> None:
    plain = _count(client, input="Say hello")
    labelled = _count(client, input="Say hello", extra_body={"client_metadata": {"x": "a long label " * 20}})
    assert labelled == plain


@pytest.mark.parametrize("effort", ["none", "minimal", "low", "medium", "high", "xhigh"])
def test_every_effort_openai_accepts_is_echoed_as_sent(client: openai.OpenAI, effort: str) -> None:
    response, _ = _create(client, input="hi", reasoning={"effort": effort}, open_responses=effort != "minimal")
    assert response["reasoning"]["effort"] == effort


def test_efforts_map_onto_the_models_levels(client: openai.OpenAI) -> None:
    """none/minimal render the prompt `low` renders, xhigh the one `high` renders (Harmony's `Reasoning:` line)."""

    def prompt_for(effort: str) -> int:
        return _count(client, input="hi", reasoning={"effort": effort})

    assert prompt_for("none") == prompt_for("minimal") == prompt_for("low")
    assert prompt_for("xhigh") == prompt_for("high")


def test_deprecated_generate_summary_is_echoed(client: openai.OpenAI) -> None:
    response, _ = _create(client, input="hi", reasoning={"generate_summary": "concise"})
    assert response["reasoning"]["generate_summary"] == "concise" and response["reasoning"]["summary"] is None


def test_verbosity_is_echoed_as_sent_and_medium_by_default(client: openai.OpenAI) -> None:
    assert _create(client, input="hi", text={"verbosity": "high"})[0]["text"]["verbosity"] == "high"
    assert _create(client, input="hi")[0]["text"]["verbosity"] == "medium"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"reasoning": {"summary": "verbose"}}, "reasoning.summary"),
        ({"reasoning": {"generate_summary": "verbose"}}, "reasoning.generate_summary"),
        ({"reasoning": {"effort": "ultra"}}, "reasoning.effort"),
        ({"text": {"verbosity": "loud"}}, "text.verbosity"),
        ({"service_tier": "gold"}, "service_tier"),
        ({"client_metadata": {"n": 1}}, "client_metadata.n"),
        ({"prompt_cache_options": {"prewarm": True}}, "prompt_cache_options.prewarm"),
        ({"moderation": {"model": "omni-moderation-latest"}}, "moderation"),
    ],
)
def test_invalid_values_are_400s_naming_the_parameter(http: httpx.Client, body: dict[str, Any], param: str) -> None:
    assert _error(http.post("/v1/responses", json={"input": "hi", **body}), 400)["param"] == param


# Compressed bodies


def _post_encoded(http: httpx.Client, body: bytes, encoding: str) -> httpx.Response:
    headers = {"content-type": "application/json", "content-encoding": encoding}
    return http.post("/v1/responses", content=body, headers=headers)


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [
        ("gzip", gzip.compress),
        ("zstd", lambda data: zstandard.ZstdCompressor().compress(data)),
        ("deflate", zlib.compress),
        ("identity", lambda data: data),
    ],
)
def test_compressed_bodies_are_decompressed(
    http: httpx.Client, encoding: str, compress: Callable[[bytes], bytes]
) -> None:
    body = json.dumps({"input": "Say hello", "max_output_tokens": 3, "metadata": {"encoding": encoding}}).encode()
    reply = _post_encoded(http, compress(body), encoding)
    assert reply.status_code == 200, reply.text
    assert assert_response_conforms(reply.text)["metadata"] == {"encoding": encoding}


def test_a_zstd_stream_without_a_content_size_is_decompressed(http: httpx.Client) -> None:
    body = json.dumps({"input": "hi", "max_output_tokens": 2}).encode()
    compressor = zstandard.ZstdCompressor().compressobj()
    reply = _post_encoded(http, compressor.compress(body) + compressor.flush(), "zstd")
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
def test_a_zip_bomb_is_a_413_once_the_decompressed_size_passes_the_limit(http: httpx.Client, encoding: str) -> None:
    padding = b" " * (50 * MAX_BODY)  # whitespace: valid JSON once decompressed, were it not too large
    body = b'{"input": "hi"' + padding + b"}"
    packed = gzip.compress(body) if encoding == "gzip" else zstandard.ZstdCompressor().compress(body)
    assert len(packed) < MAX_BODY
    error = _error(_post_encoded(http, packed, encoding), 413)
    assert "decompressed" in error["message"]


def test_an_unknown_encoding_is_a_415(http: httpx.Client) -> None:
    error = _error(_post_encoded(http, b"\x00\x01", "compress"), 415)
    assert "compress" in error["message"]


def test_a_corrupt_compressed_body_is_a_400(http: httpx.Client) -> None:
    assert _error(_post_encoded(http, b"not gzip at all", "gzip"), 400)["code"] == "invalid_body"


# Input shapes


def _input_items(client: openai.OpenAI, response_id: str) -> list[dict[str, Any]]:
    items = [
        item.model_dump(mode="json", exclude_unset=True) for item in client.responses.input_items.list(response_id)
    ]
    for item in items:
        OPENAI_ITEM.validate_python(item, strict=True)
    return list(reversed(items))  # the listing is newest first


def test_function_call_output_as_content_parts_renders_its_text(client: openai.OpenAI) -> None:
    parts = [{"type": "input_text", "text": "It is "}, {"type": "input_text", "text": "sunny."}]
    as_parts = [CALL, {"type": "function_call_output", "call_id": "call_1", "output": parts}]
    as_text = [CALL, {"type": "function_call_output", "call_id": "call_1", "output": "It is sunny."}]
    assert _count(client, input=as_parts, tools=[LOOKUP]) == _count(client, input=as_text, tools=[LOOKUP])
    response, _ = _create(client, input=as_parts, tools=[LOOKUP])
    stored = _input_items(client, response["id"])
    assert stored[1]["output"] == parts


def test_an_image_in_a_tool_output_is_accepted_and_said_unseen(client: openai.OpenAI) -> None:
    parts = [
        {"type": "input_text", "text": "Screenshot:"},
        {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "auto"},
        {"type": "input_file", "filename": "log.txt", "file_data": "aGVsbG8="},
    ]
    items = [CALL, {"type": "function_call_output", "call_id": "call_1", "output": parts}]
    text_only = [CALL, {"type": "function_call_output", "call_id": "call_1", "output": "Screenshot:"}]
    # The model reads a note where the image and the file were, not their bytes.
    assert _count(client, input=items, tools=[LOOKUP]) > _count(client, input=text_only, tools=[LOOKUP])
    response, _ = _create(client, input=items, tools=[LOOKUP])
    assert _input_items(client, response["id"])[1]["output"] == parts


def test_custom_tool_call_output_as_content_parts(client: openai.OpenAI) -> None:
    call = {"type": "custom_tool_call", "call_id": "call_2", "name": "shell", "input": "ls"}
    output = {"type": "custom_tool_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "a b"}]}
    response, _ = _create(
        client, input=[call, output], tools=[{"type": "custom", "name": "shell"}], open_responses=False
    )
    assert _input_items(client, response["id"])[1]["output"] == [{"type": "input_text", "text": "a b"}]


def test_refusal_parts_and_phase_on_assistant_messages(client: openai.OpenAI) -> None:
    refused = {
        "role": "assistant",
        "content": [{"type": "refusal", "refusal": "I can't help."}],
        "phase": "final_answer",
    }
    said = {"role": "assistant", "content": [{"type": "output_text", "text": "I can't help."}]}
    question = {"role": "user", "content": "Why not?"}
    assert _count(client, input=[refused, question]) == _count(client, input=[said, question])
    commentary = {"role": "assistant", "content": "Looking it up.", "phase": "commentary", "type": "message"}
    response, _ = _create(client, input=[refused, commentary, question])
    stored = _input_items(client, response["id"])
    assert stored[0]["content"] == [{"type": "refusal", "refusal": "I can't help."}]
    assert [item.get("phase") for item in stored] == ["final_answer", "commentary", None]


def test_a_refusal_part_in_a_user_message_is_a_400(http: httpx.Client) -> None:
    body = {"input": [{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}]}
    assert _error(http.post("/v1/responses", json=body), 400)["param"] == "input[0]"


def test_function_calls_of_a_namespace_are_accepted_as_input(client: openai.OpenAI) -> None:
    call = {**CALL, "namespace": "multi_agent_v1"}
    output = {"type": "function_call_output", "call_id": "call_1", "output": "ok", "namespace": "multi_agent_v1"}
    response, _ = _create(client, input=[call, output], tools=[LOOKUP])
    assert _input_items(client, response["id"])[0]["namespace"] == "multi_agent_v1"


def test_item_reference_resolves_to_the_stored_item(client: openai.OpenAI) -> None:
    first, _ = _create(client, input="Remember the number 7.")
    (message,) = _input_items(client, first["id"])
    output_ids = [item["id"] for item in first["output"]]
    question = {"role": "user", "content": "Which number?"}
    spelled_out = _count(client, input=[{"role": "user", "content": "Remember the number 7."}, question])
    by_reference = [{"type": "item_reference", "id": message["id"]}, question]
    assert _count(client, input=by_reference) == spelled_out
    assert _count(client, input=[{"id": message["id"]}, question]) == spelled_out  # `type` may be left out
    response, _ = _create(client, input=[*by_reference[:1], *[{"type": "item_reference", "id": i} for i in output_ids]])
    stored = _input_items(client, response["id"])
    assert stored[0] == message and [item["id"] for item in stored[1:]] == output_ids


def test_compaction_keeps_a_referenced_user_message_verbatim(client: openai.OpenAI) -> None:
    first, _ = _create(client, input="Keep me verbatim.")
    (message,) = _input_items(client, first["id"])
    compacted = client.responses.compact(
        model=first["model"], input=[{"type": "item_reference", "id": message["id"]}, {"role": "user", "content": "x"}]
    )
    kept = [item.model_dump(mode="json", exclude_unset=True) for item in compacted.output if item.type == "message"]
    assert kept[0]["content"] == message["content"]


def test_item_reference_resolves_a_conversation_item(client: openai.OpenAI) -> None:
    conversation = client.conversations.create(items=[{"role": "user", "content": "Kept in a conversation."}])
    (item,) = client.conversations.items.list(conversation.id).data
    assert item.id is not None
    spelled_out = _count(client, input=[{"role": "user", "content": "Kept in a conversation."}])
    assert _count(client, input=[{"type": "item_reference", "id": item.id}]) == spelled_out


def test_a_conversation_given_an_item_reference_stores_the_item_it_names(
    client: openai.OpenAI, http: httpx.Client
) -> None:
    """Creating a conversation or adding items: a reference is stored (and listed) as the item it names, a
    response's input or a conversation's item; an unknown one is a 404 naming its index, and adds nothing."""
    first, _ = _create(client, input="Remember the number 7.")
    (message,) = _input_items(client, first["id"])
    conversation = client.conversations.create(items=[{"type": "item_reference", "id": message["id"]}])
    (kept,) = [
        item.model_dump(mode="json", exclude_unset=True) for item in client.conversations.items.list(conversation.id)
    ]
    assert kept == message
    added = client.conversations.items.create(
        conversation.id, items=[{"role": "user", "content": "Then?"}, {"type": "item_reference", "id": kept["id"]}]
    )
    assert [item.model_dump(mode="json", exclude_unset=True) for item in added.data][1] == message
    unknown = {"items": [{"role": "user", "content": "x"}, {"type": "item_reference", "id": "msg_nope"}]}
    assert _error(http.post(f"/v1/conversations/{conversation.id}/items", json=unknown), 404)["param"] == "items[1]"
    assert _error(http.post("/v1/conversations", json=unknown), 404)["param"] == "items[1]"
    assert len(client.conversations.items.list(conversation.id).data) == 3


def test_an_unknown_item_reference_is_a_404_naming_the_input_index(http: httpx.Client) -> None:
    body = {"input": [{"role": "user", "content": "hi"}, {"type": "item_reference", "id": "msg_nope"}]}
    assert _error(http.post("/v1/responses", json=body), 404)["param"] == "input[1]"


def test_an_unstored_responses_items_cannot_be_referenced(http: httpx.Client) -> None:
    secret = {"type": "message", "id": "msg_unstored_secret", "role": "user", "content": "secret"}
    unstored = http.post("/v1/responses", json={"input": [secret], "store": False, "max_output_tokens": 2})
    assert unstored.status_code == 200
    body = {"input": [{"type": "item_reference", "id": secret["id"]}]}
    assert _error(http.post("/v1/responses", json=body), 404)["param"] == "input[0]"


# Tools


def test_tools_this_server_does_not_run_are_accepted_echoed_and_said(client: openai.OpenAI) -> None:
    tools: list[Any] = [
        {"type": "web_search", "external_web_access": False},
        {"type": "file_search", "vector_store_ids": ["vs_1"]},
        {"type": "image_generation"},
        {"type": "computer_use_preview", "display_width": 1024, "display_height": 768, "environment": "linux"},
        {"type": "web_search_preview"},
        {"type": "tool_search", "execution": "client"},
        LOOKUP,
    ]
    response, reply = _create(client, input="hi", tools=tools, open_responses=False)
    assert response["tools"][:6] == tools[:6]  # echoed as sent
    assert reply["x-tools-not-offered"] == (
        "web_search,file_search,image_generation,computer_use_preview,web_search_preview,tool_search"
    )
    # Only `lookup` reaches the model.
    assert _count(client, input="hi", tools=tools) == _count(client, input="hi", tools=[LOOKUP])


def test_a_streamed_create_says_which_tools_were_not_offered(http: httpx.Client) -> None:
    body = {"input": "hi", "tools": [{"type": "web_search"}], "stream": True, "max_output_tokens": 2}
    with http.stream("POST", "/v1/responses", json=body) as reply:
        assert reply.status_code == 200 and reply.headers["x-tools-not-offered"] == "web_search"
        reply.read()


def test_a_request_without_unoffered_tools_has_no_header(client: openai.OpenAI) -> None:
    _, reply = _create(client, input="hi", tools=[LOOKUP])
    assert "x-tools-not-offered" not in reply


def test_deferred_and_namespaced_functions_are_offered(client: openai.OpenAI) -> None:
    spawn = {
        "type": "function",
        "name": "spawn_agent",
        "description": "Start an agent.",
        "parameters": LOOKUP["parameters"],
    }
    namespace = {"type": "namespace", "name": "multi_agent_v1", "description": "Agents.", "tools": [spawn]}
    deferred = {**LOOKUP, "defer_loading": True}
    response, reply = _create(client, input="hi", tools=[namespace, deferred], open_responses=False)
    assert response["tools"][0]["type"] == "namespace" and response["tools"][1]["defer_loading"] is True
    Response.model_validate(response, strict=True)
    assert "x-tools-not-offered" not in reply
    flat = _count(client, input="hi", tools=[spawn, LOOKUP])  # rendered as plain functions
    assert _count(client, input="hi", tools=[namespace, deferred]) == flat


def test_a_name_shared_across_a_namespace_is_a_400(http: httpx.Client) -> None:
    namespace = {"type": "namespace", "name": "ns", "description": "", "tools": [LOOKUP]}
    reply = http.post("/v1/responses", json={"input": "hi", "tools": [LOOKUP, namespace]})
    assert _error(reply, 400)["param"] == "tools[1].tools[0].name"


def test_the_operator_can_refuse_tools_this_server_does_not_run(app_factory: ServerFactory, tmp_path: Path) -> None:
    server = app_factory(
        f"sqlite+aiosqlite:///{tmp_path / 'refuse.db'}", SERVICE_REFUSE_UNSUPPORTED_TOOLS="true"
    ).start()
    body = {"input": "hi", "tools": [LOOKUP, {"type": "web_search"}]}
    error = _error(httpx.post(server.url + "/v1/responses", json=body, timeout=120), 400)
    assert error["param"] == "tools[1].type" and error["code"] == "unsupported_tool"
