"""A non-Harmony model brought by the user: an ONNX decoder in the standard (Optimum) layout with
a tokenizer.json and a chat template, loaded offline through transformers and served end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from service.engine.builder import build_random_decoder
from service.engine.config import DecoderConfig
from service.prompting.testing_tokenizer import write_tiny_chat_model_tokenizer
from tests.api_helpers import assert_well_formed_stream, client_for, final_text, text_from_deltas
from tests.conftest import ROOT, ServerProcess
from tests.engine_fixtures import SMALL


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model_dir = tmp_path_factory.mktemp("models") / "tiny-chatml"
    tokenizer_dir = tmp_path_factory.mktemp("tokenizer")
    vocab_size = write_tiny_chat_model_tokenizer(tokenizer_dir)
    shape = {"vocab_size": vocab_size, "max_position": 1024, "tie_embeddings": True, "eos_token_id": 2}
    config = DecoderConfig(**{**SMALL.to_dict(), **shape})
    build_random_decoder(
        model_dir,
        config,
        seed=3,
        quantize=True,
        graph="standard",
        extra={"model_id": "tiny-chatml", "chat_format": "chat_template"},
    )
    for path in tokenizer_dir.iterdir():
        (model_dir / path.name).write_bytes(path.read_bytes())
    return model_dir


def test_model_info_reports_an_int8_standard_graph(chat_model_dir: Path) -> None:
    output = subprocess.run(
        [sys.executable, "-m", "service", "model", "info", str(chat_model_dir)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    info = json.loads(output)
    assert info["model_id"] == "tiny-chatml"
    assert info["quantization"]["weight_type"] == "int8"
    int8_ops = sum(info["op_counts"].get(op, 0) for op in ("MatMulInteger", "DynamicQuantizeMatMul", "MatMulNBits"))
    assert int8_ops > 0, info["op_counts"]
    assert info["int8_kernel"] in ("avx512_vnni", "avx_vnni", "amx_int8") or info["int8_kernel"].startswith("avx2")
    assert info["cpu"]["avx2"] is True and "onnxruntime" in info


def test_chat_template_model_serves_plain_and_streaming(
    chat_model_dir: Path, database_url: str, app_factory: Callable[..., ServerProcess]
) -> None:
    server = app_factory(database_url, SERVICE_MODEL=str(chat_model_dir)).start()
    client = client_for(server.url)
    assert [m.id for m in client.models.list().data] == ["tiny-chatml"]
    response = client.responses.create(input="Hello", instructions="Be brief.", max_output_tokens=20)
    assert response.model == "tiny-chatml"
    assert [item.type for item in response.output] == ["message"]
    events = [e.model_dump() for e in client.responses.create(input="Stream it", max_output_tokens=20, stream=True)]
    assert_well_formed_stream(events)
    assert final_text(events[-1]["response"]) == text_from_deltas(events)
    follow = client.responses.create(input="More", previous_response_id=response.id, max_output_tokens=5)
    assert follow.usage and response.usage and follow.usage.input_tokens > response.usage.input_tokens


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_chat_template_model_structured_output(
    chat_model_dir: Path, database_url: str, app_factory: Callable[..., ServerProcess]
) -> None:
    """text.format constrains a chat-template model's whole completion; forced and strict calls are
    written in the template's `<tool_call>` syntax and parsed into function_call items; custom tools
    (raw input) are a 400 for these models."""
    import jsonschema
    import openai

    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
    text: Any = {"format": {"type": "json_schema", "name": "r", "schema": schema, "strict": True}}
    server = app_factory(database_url, SERVICE_MODEL=str(chat_model_dir)).start()
    client = client_for(server.url)
    for seed in (1, 2):
        response = client.responses.create(input="Answer", text=text, max_output_tokens=60, extra_body={"seed": seed})
        assert response.status == "completed"
        jsonschema.validate(json.loads(response.output_text), schema)
    params = {
        "type": "object",
        "properties": {"city": {"enum": ["paris", "rome"]}},
        "required": ["city"],
        "additionalProperties": False,
    }
    tools: Any = [
        {"type": "function", "name": "weather", "strict": True, "parameters": params},
        {
            "type": "function",
            "name": "other",
            "strict": True,
            "parameters": {**params, "properties": {}, "required": []},
        },
    ]
    choices: list[Any] = ["required", {"type": "function", "name": "weather"}]
    for choice in choices:
        forced = client.responses.create(input="x", tools=tools, tool_choice=choice, max_output_tokens=150).model_dump()
        assert forced["status"] == "completed", forced["output"]
        calls = [item for item in forced["output"] if item["type"] == "function_call"]
        assert len(calls) == 1 and calls[0]["name"] in ({"weather", "other"} if choice == "required" else {"weather"})
        if calls[0]["name"] == "weather":
            jsonschema.validate(json.loads(calls[0]["arguments"]), params)
    custom: Any = {"type": "custom", "name": "c"}
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(input="x", tools=[custom], max_output_tokens=5)
    assert isinstance(info.value.body, dict) and info.value.body["param"] == "tools[0]"
