"""The trained built-in model: the shipped artifact, and its behaviour end to end through the real
server with the official client (it stops by itself, reasons, calls tools, uses their output)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from openai.types.responses import FunctionToolParam, ResponseInputParam

from service.engine.compact import (
    EMBED_INDEX,
    HEAD_IDS,
    UNSEEN_LOGIT,
    ArtifactError,
    CompactModel,
    graph_weights,
    load_compact,
    read_head_ids,
    sha256_file,
)
from service.engine.config import DecoderConfig, read_config
from service.engine.model_dir import (
    BUILTIN_ARTIFACT_DIR,
    BUILTIN_MANIFEST,
    BUILTIN_NAME,
    HARMONY_VOCAB_SIZE,
    describe_builtin,
    read_manifest,
)
from service.engine.model_files import ModelDirError
from tests.api_helpers import client_for
from tests.conftest import ServerProcess, app_on_backend

# The issue's targets; the manifest records what bench/builtin_quality.py measured.
TARGETS = {
    "well_formed": 0.99,
    "ended_by_itself": 0.95,
    "tool_decision": 0.95,
    "arguments_json_valid": 0.99,
    "argument_copied": 0.90,
    "answer_has_tool_value": 0.90,
}
WEATHER: FunctionToolParam = {
    "type": "function",
    "strict": False,
    "name": "get_weather",
    "description": "Get the current weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city name"}},
        "required": ["city"],
    },
}


def test_artifact_matches_its_manifest() -> None:
    manifest = read_manifest()
    artifact = BUILTIN_ARTIFACT_DIR / manifest["artifact"]
    assert sha256_file(artifact) == manifest["sha256"]
    assert artifact.stat().st_size == manifest["size_bytes"] <= 16 * 1024 * 1024  # issue 41: at most 16 MB
    assert manifest["model_id"] == BUILTIN_NAME
    assert manifest["decoder"]["vocab_size"] == HARMONY_VOCAB_SIZE
    compact = load_compact(artifact, manifest["sha256"])
    assert compact.vocab_ids.size == manifest["compact_vocab"]["input_ids"]
    assert set(compact.target_ids.tolist()) <= set(compact.vocab_ids.tolist())
    assert describe_builtin()["sha256"] == manifest["sha256"]


def _quality() -> dict[str, Any]:
    quality: dict[str, Any] = read_manifest()["metrics"]["quality"]
    assert quality["samples"] >= 200 and quality["temperature"] == 1.0 and quality["max_output_tokens"] == 256
    return quality


def test_recorded_metrics_meet_the_targets_the_shipped_model_reaches() -> None:
    quality = _quality()
    for key in ("well_formed", "ended_by_itself", "tool_decision", "arguments_json_valid", "argument_copied"):
        assert quality[key]["of"] > 0, key
        assert quality[key]["rate"] >= TARGETS[key], (key, quality[key])


def test_recorded_metrics_meet_all_of_the_issues_targets() -> None:
    quality = _quality()
    missed = {key: quality[key]["rate"] for key, target in TARGETS.items() if quality[key]["rate"] < target}
    assert not missed, missed


def test_recorded_call_arguments_close_within_64_tokens() -> None:
    """Issue 41's bound on arguments that never end, on today's held-out set: >= 99.5% close within 64 tokens."""
    closed = _quality()["arguments_closed_64"]
    assert closed["of"] > 0 and closed["rate"] >= 0.995, closed


def test_build_default_materialises_and_reports_what_it_loaded(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "service", "model", "build-default", "--cache-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    report = json.loads(done.stdout[done.stdout.index("{") :])
    manifest = read_manifest()
    assert report["model_id"] == BUILTIN_NAME and report["sha256"] == manifest["sha256"]
    assert report["metrics"] == manifest["metrics"]
    model_dir = Path(report["path"])
    assert model_dir.parent == tmp_path and manifest["sha256"][:12] in model_dir.name
    config = json.loads((model_dir / "config.json").read_text())
    assert config["artifact_sha256"] == manifest["sha256"] and config["vocab_size"] == HARMONY_VOCAB_SIZE


def test_a_corrupt_artifact_is_refused(tmp_path: Path) -> None:
    manifest = read_manifest()
    broken = tmp_path / manifest["artifact"]
    data = bytearray((BUILTIN_ARTIFACT_DIR / manifest["artifact"]).read_bytes())
    data[len(data) // 2] ^= 0xFF
    broken.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="SHA-256"):
        load_compact(broken, manifest["sha256"])
    assert BUILTIN_MANIFEST.is_file()


def test_graph_weights_keep_the_tables_compact_with_their_id_maps() -> None:
    config = DecoderConfig(
        vocab_size=50, hidden_size=4, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=2, intermediate_size=8,
        max_position=16,
    )  # fmt: skip
    rng = np.random.default_rng(0)
    vocab_ids = np.array([3, 7, 20], dtype=np.int32)
    weights = {
        "model.embed_tokens.weight": rng.standard_normal((4, 4)).astype(np.float32),
        "lm_head.weight": rng.standard_normal((4, 4)).astype(np.float32),
    }
    w = graph_weights(CompactModel(weights, vocab_ids, np.array([20, 7], dtype=np.int32)), config)
    emb, index = w["model.embed_tokens.weight"], w[EMBED_INDEX]
    assert index.shape == (50,)
    np.testing.assert_array_equal(emb[index[[3, 7, 20]]], weights["model.embed_tokens.weight"][1:])
    assert (index[np.setdiff1d(np.arange(50), vocab_ids)] == 0).all()  # unseen -> row 0
    assert w[HEAD_IDS].tolist() == [7, 20]  # ascending
    np.testing.assert_array_equal(w["lm_head.weight"], weights["lm_head.weight"][[2, 3]])
    with pytest.raises(ArtifactError, match="target ids"):
        graph_weights(CompactModel(weights, vocab_ids, np.array([8], dtype=np.int32)), config)


def test_a_compact_head_gives_every_other_id_no_mass(tmp_path: Path) -> None:
    """The graph scatters a compact head's logits into the vocabulary (UNSEEN_LOGIT elsewhere), row by row as
    a full head with a -1e4 bias gave them, and gathers the embedding through its id map."""
    import onnxruntime as ort

    from service.engine.builder import write_contrib_model

    config = DecoderConfig(
        vocab_size=300, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
        intermediate_size=64, max_position=64,
    )  # fmt: skip
    rng = np.random.default_rng(1)
    vocab_ids = np.array([5, 9, 17, 250], dtype=np.int32)
    h = config.hidden_size
    weights = {name: rng.standard_normal(shape).astype(np.float32) * 0.2 for name, shape in [
        ("model.embed_tokens.weight", (5, h)), ("lm_head.weight", (5, h)), ("model.norm.weight", (h,)),
        ("model.layers.0.input_layernorm.weight", (h,)), ("model.layers.0.post_attention_layernorm.weight", (h,)),
        ("model.layers.0.self_attn.q_proj.weight", (32, h)), ("model.layers.0.self_attn.k_proj.weight", (16, h)),
        ("model.layers.0.self_attn.v_proj.weight", (16, h)), ("model.layers.0.self_attn.o_proj.weight", (h, 32)),
        ("model.layers.0.mlp.gate_proj.weight", (64, h)), ("model.layers.0.mlp.up_proj.weight", (64, h)),
        ("model.layers.0.mlp.down_proj.weight", (h, 64)),
    ]}  # fmt: skip
    compact = CompactModel(weights, vocab_ids, np.array([9, 250], dtype=np.int32))
    model = write_contrib_model(tmp_path / "m", config, graph_weights(compact, config), quantize=False)
    session = ort.InferenceSession(str(model / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds: dict[str, np.ndarray] = {
        "input_ids": np.array([[9, 250, 3], [17, 1, 299]]),
        "attention_mask": np.ones((2, 3), np.int64),
    }
    for spec in session.get_inputs()[2:]:
        feeds[spec.name] = np.zeros((2, 1, 8, 16), np.float32)
    logits = session.run(["logits"], feeds)[0]
    assert logits.shape == (2, 1, 300)
    written = np.zeros(300, dtype=bool)
    written[[9, 250]] = True
    assert (logits[:, :, ~written] == UNSEEN_LOGIT).all()
    assert (np.abs(logits[:, :, written]) < 100).all() and not np.array_equal(logits[0], logits[1])
    # the written ids' logits as full-vocabulary tables give them: every id's embedding row, a head row per id
    w = graph_weights(compact, config)
    full = {k: v for k, v in w.items() if k not in (EMBED_INDEX, HEAD_IDS)}
    full["model.embed_tokens.weight"] = w["model.embed_tokens.weight"][w[EMBED_INDEX]]
    full["lm_head.weight"] = np.zeros((300, h), np.float32)
    full["lm_head.weight"][w[HEAD_IDS]] = w["lm_head.weight"]
    wide = write_contrib_model(tmp_path / "full", config, full, quantize=False)
    reference = ort.InferenceSession(str(wide / "model.onnx"), providers=["CPUExecutionProvider"])
    expected = reference.run(["logits"], feeds)[0]
    np.testing.assert_allclose(expected[:, :, written], logits[:, :, written], rtol=1e-5, atol=1e-5)
    # an unseen id reads row 0, as any other unseen id does: swapping 3 for 4 changes nothing
    feeds["input_ids"] = np.array([[9, 250, 4], [17, 2, 298]])
    np.testing.assert_array_equal(session.run(["logits"], feeds)[0], logits)
    # the config names the head's ids for the sampler; a full head names none
    named = read_head_ids(model, read_config(model).extra, 300)
    assert named is not None and named.tolist() == [9, 250]
    assert read_head_ids(wide, read_config(wide).extra, 300) is None


def test_the_served_models_name_their_graphs_head_ids(builtin_model_dir: Path, random_model_dir: Path) -> None:
    """The sampler draws over the ids the config names (head_ids.npy): exactly the graph's compact head."""
    import onnx
    from onnx import numpy_helper

    for model_dir in (builtin_model_dir, random_model_dir):
        graph = onnx.load(str(model_dir / "model.onnx"), load_external_data=False).graph
        (ids,) = [numpy_helper.to_array(t) for t in graph.initializer if t.name == HEAD_IDS]
        named = read_head_ids(model_dir, read_config(model_dir).extra, HARMONY_VOCAB_SIZE)
        assert named is not None
        np.testing.assert_array_equal(named, ids.reshape(-1))


def test_a_broken_head_ids_file_is_a_one_line_model_error(tmp_path: Path) -> None:
    for content in (b"not numpy", None):
        if content is not None:
            (tmp_path / "head_ids.npy").write_bytes(content)
        else:
            np.save(tmp_path / "head_ids.npy", np.array([5, 3]))
        with pytest.raises(ModelDirError, match="head_ids.npy"):
            read_head_ids(tmp_path, {"head_ids": "head_ids.npy"}, 10)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, builtin_model_dir: Path
) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp(f"builtin-{request.param}")
    yield from app_on_backend(request.param, tmp, SERVICE_MODEL=str(builtin_model_dir))


@pytest.fixture
def client(server: ServerProcess) -> openai.OpenAI:
    return client_for(server.url)


def _types(response: object) -> list[str]:
    return [item.type for item in response.output]  # type: ignore[attr-defined]


def test_a_plain_request_completes_with_reasoning_and_a_message(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=BUILTIN_NAME, input="Say hello to Alice.", temperature=0, extra_body={"seed": 1}
    )
    assert response.status == "completed", response.model_dump_json()
    assert response.model == BUILTIN_NAME
    assert _types(response) == ["reasoning", "message"]
    reasoning = response.output[0]
    assert reasoning.type == "reasoning" and reasoning.content and reasoning.content[0].text.strip()
    assert response.output_text.strip()
    assert response.usage is not None and response.usage.output_tokens < 256


def test_a_streamed_request_completes_and_the_sdk_gets_the_final_response(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model=BUILTIN_NAME,
        input="Write a short poem about the sea.",
        reasoning={"effort": "high"},
        temperature=0,
        extra_body={"seed": 2},
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert final.status == "completed"
    assert "response.reasoning_text.delta" in kinds and "response.output_text.delta" in kinds
    assert kinds[-1] == "response.completed"
    assert final.output_text.strip()
    stored = client.responses.retrieve(final.id)
    assert stored.status == "completed" and stored.output_text == final.output_text
    ids = [(item.type, item.model_dump().get("id")) for item in stored.output]
    assert ids == [(item.type, item.model_dump().get("id")) for item in final.output]


def test_a_matching_tool_is_called_and_its_output_answered(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model=BUILTIN_NAME,
        input="What's the weather in Paris?",
        tools=[WEATHER],
        tool_choice="auto",
        temperature=0,
        extra_body={"seed": 3},
    )
    assert first.status == "completed", first.model_dump_json()
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments) == {"city": "Paris"}
    tool_result: ResponseInputParam = [
        {
            "type": "function_call_output",
            "call_id": calls[0].call_id,
            "output": json.dumps({"city": "Paris", "temperature": 21, "condition": "sunny"}),
        }
    ]
    second = client.responses.create(
        model=BUILTIN_NAME,
        previous_response_id=first.id,
        input=tool_result,
        tools=[WEATHER],
        temperature=0,
        extra_body={"seed": 4},
    )
    assert second.status == "completed", second.model_dump_json()
    assert _types(second)[-1] == "message"
    assert second.output_text.strip()  # whether it quotes the tool's value is measured by bench/builtin_quality.py


def test_without_a_fitting_tool_it_answers_without_calling(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=BUILTIN_NAME,
        input="Tell me about the penguin.",
        tools=[WEATHER],
        temperature=0,
        extra_body={"seed": 5},
    )
    assert response.status == "completed"
    assert "function_call" not in _types(response)
    assert response.output_text.strip()
