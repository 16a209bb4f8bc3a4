"""Converting a standard-op fp32 decoder to the contrib layout (`model quantize SRC DST --layout contrib`):
the same logits as the source, batched decoding bit-identical to decoding alone, and clear refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from service.engine.config import CONFIG_FILE, read_config
from service.engine.convert import convert_to_contrib
from service.engine.export_weights import hf_name, weights_from_export
from service.engine.graph_standard import LM_HEAD
from service.engine.model_files import MODEL_FILE, ModelDirError
from service.engine.onnx_engine import OnnxEngine
from service.engine.weights import random_weights
from tests.cli_helpers import assert_one_line_error, run_cli
from tests.engine_fixtures import (
    SEED,
    SMALL,
    assert_batch_invariant,
    contrib_int8_dir,
    greedy,
    prefilled_logits,
    prompt,
    small_fp32_dir,
    small_tied_fp32_dir,
)

__all__ = ["contrib_int8_dir", "small_fp32_dir", "small_tied_fp32_dir"]

PROMPTS = [prompt(1), prompt(7, start=11), prompt(23, start=400)]


def next_token_logits(model_dir: Path, ids: list[int]) -> np.ndarray:
    eng = OnnxEngine(model_dir, intra_op_threads=1)
    eng.add_sequence("s", ids, greedy(1))
    return np.asarray(prefilled_logits(eng, "s")).reshape(-1).copy()


@pytest.fixture(scope="module")
def converted_int8(small_fp32_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Through the CLI, as a user would."""
    root = tmp_path_factory.mktemp("converted")
    src, dst = root / "fp32", root / "int8"
    shutil.copytree(small_fp32_dir, src)
    (src / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    # Blocks of 32, as the builder's default that contrib_int8_dir is made with (the CLI's own default is the CPU's)
    result = run_cli("model", "quantize", str(src), str(dst), "--layout", "contrib", "--block-size", "32")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "matmulnbits_int8" in result.stdout
    return dst


@pytest.mark.parametrize("fixture", ["small_fp32_dir", "small_tied_fp32_dir"])
def test_converted_fp32_gives_the_source_logits(fixture: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    src: Path = request.getfixturevalue(fixture)
    dst = convert_to_contrib(src, tmp_path / "fp32", quantize=False)
    for ids in PROMPTS:
        want, got = next_token_logits(src, ids), next_token_logits(dst, ids)
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * float(np.abs(want).max()))


def test_converted_int8_is_the_model_build_random_writes(converted_int8: Path, contrib_int8_dir: Path) -> None:
    """Same weights, same builder: the conversion of the seeded fp32 model equals the contrib int8 model
    built from that seed, logits bit for bit."""
    for ids in PROMPTS:
        assert np.array_equal(next_token_logits(converted_int8, ids), next_token_logits(contrib_int8_dir, ids))


def test_converted_int8_stays_close_to_the_source(converted_int8: Path, small_fp32_dir: Path) -> None:
    for ids in PROMPTS:
        want, got = next_token_logits(small_fp32_dir, ids), next_token_logits(converted_int8, ids)
        assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
        assert np.argmax(got) == np.argmax(want)


def test_converted_int8_decodes_batched_bit_identically(converted_int8: Path) -> None:
    assert_batch_invariant(converted_int8)


def test_the_converted_directory_says_it_batches(converted_int8: Path, small_fp32_dir: Path) -> None:
    meta = read_config(converted_int8)
    assert meta.decoder == read_config(small_fp32_dir).decoder
    assert meta.extra["graph"] == "contrib" and meta.extra["kv_cache"] == "shared_buffer"
    assert meta.extra["converted_from"] == {"graph": "standard", "file": MODEL_FILE}
    assert (converted_int8 / "tokenizer_config.json").read_text() == '{"chat_template": "{{ messages }}"}'
    info = json.loads(run_cli("model", "info", str(converted_int8)).stdout)
    assert info["decoding"]["batched"] is True and info["decoding"]["batch_invariant"] is True
    assert info["op_counts"]["MatMulNBits"] == 4 * SMALL.num_layers + 1 and "MatMul" not in info["op_counts"]
    source = json.loads(run_cli("model", "info", str(small_fp32_dir)).stdout)
    assert source["decoding"]["batched"] is False and "--layout contrib" in source["decoding"]["note"]


def _torch_like(src: Path, dst: Path) -> None:
    """Our standard graph renamed the way torch.onnx.export names things: projection weights under
    generated names, found only through the scope of the MatMul that reads them."""
    shutil.copytree(src, dst)
    model = onnx.load(str(dst / MODEL_FILE))
    renamed: dict[str, str] = {}
    for i, t in enumerate(model.graph.initializer):
        if t.name.endswith("_proj.weight_t") or t.name == LM_HEAD:
            renamed[t.name] = f"onnx::MatMul_{100 + i}"
            t.name = renamed[t.name]
    for node in model.graph.node:
        for j, name in enumerate(node.input):
            if name in renamed:
                hf = "lm_head" if name == LM_HEAD else name.removesuffix(".weight_t")
                node.name = "/" + hf.replace(".", "/").replace("layers/", "layers.") + "/MatMul"
                node.input[j] = renamed[name]
    config = json.loads((dst / CONFIG_FILE).read_text())
    del config["graph"]  # not ours any more: read as an export
    (dst / CONFIG_FILE).write_text(json.dumps({**config, "model_type": "llama"}))
    onnx.save(model, str(dst / MODEL_FILE))


def test_weights_are_found_through_the_node_scope(small_fp32_dir: Path, tmp_path: Path) -> None:
    _torch_like(small_fp32_dir, tmp_path / "export")
    found = weights_from_export(onnx.load(str(tmp_path / "export" / MODEL_FILE)))
    want = random_weights(SMALL, SEED)
    assert sorted(found) == sorted(want)
    assert all(np.array_equal(found[k], want[k]) for k in want)
    dst = convert_to_contrib(tmp_path / "export", tmp_path / "fp32", quantize=False)
    for ids in PROMPTS[:2]:
        np.testing.assert_allclose(next_token_logits(dst, ids), next_token_logits(small_fp32_dir, ids), atol=1e-3)


def test_weights_in_a_merged_decoders_subgraphs_are_found(small_fp32_dir: Path, tmp_path: Path) -> None:
    """Optimum's merged decoder keeps the initializers at the top and the nodes in an If's branches."""
    _torch_like(small_fp32_dir, tmp_path / "export")
    model = onnx.load(str(tmp_path / "export" / MODEL_FILE))
    outputs = [o.name for o in model.graph.output]
    branch = helper.make_graph(list(model.graph.node), "branch", [], list(model.graph.output))
    merged = helper.make_node("If", ["use_cache_branch"], outputs, then_branch=branch, else_branch=branch)
    del model.graph.node[:]
    model.graph.node.append(merged)
    found = weights_from_export(model)
    want = random_weights(SMALL, SEED)
    assert sorted(found) == sorted(want)
    assert all(np.array_equal(found[k], want[k]) for k in want)


def test_hf_names_from_scopes_and_wrapped_names() -> None:
    assert hf_name("/model/layers.0/self_attn/q_proj") == "model.layers.0.self_attn.q_proj"
    assert hf_name("m.model.layers.3.input_layernorm.weight") == "model.layers.3.input_layernorm.weight"
    assert hf_name("/m/lm_head") == "lm_head"
    assert hf_name("onnx::MatMul_12") is None and hf_name("/model/rotary_emb") is None


def test_a_missing_weight_is_named_and_nothing_is_written(small_fp32_dir: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(small_fp32_dir, src)
    model = onnx.load(str(src / MODEL_FILE))
    kept = [t for t in model.graph.initializer if t.name != "model.layers.1.mlp.up_proj.weight_t"]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    onnx.save(model, str(src / MODEL_FILE))
    result = run_cli("model", "quantize", str(src), str(tmp_path / "dst"), "--layout", "contrib")
    assert_one_line_error(result, "missing 1 weight(s)", "model.layers.1.mlp.up_proj.weight")
    assert not (tmp_path / "dst").exists() and [p.name for p in tmp_path.iterdir()] == ["src"]


def test_a_graph_that_is_not_a_decoder_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / CONFIG_FILE).write_text(json.dumps(SMALL.to_dict()))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph), str(src / MODEL_FILE))
    result = run_cli("model", "quantize", str(src), str(tmp_path / "dst"), "--layout", "contrib")
    assert_one_line_error(result, "is not a decoder graph", "inputs ['x']")
    assert not (tmp_path / "dst").exists()


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "RoPE scaling 'yarn'"),
        ({"model_type": "phi3"}, "model_type 'phi3'"),
        ({"model_type": "mistral", "sliding_window": 64, "max_position_embeddings": 128}, "sliding-window"),
        ({"model_type": "llama", "attention_bias": True}, "attention biases"),
    ],
)
def test_architectures_the_contrib_graph_cannot_express_are_refused(
    small_fp32_dir: Path, tmp_path: Path, change: dict[str, object], reason: str
) -> None:
    src = tmp_path / "src"
    shutil.copytree(small_fp32_dir, src)
    config = json.loads((src / CONFIG_FILE).read_text())
    (src / CONFIG_FILE).write_text(json.dumps({**config, **change}))
    with pytest.raises(ModelDirError, match="cannot be converted to the contrib layout") as caught:
        convert_to_contrib(src, tmp_path / "dst")
    assert reason in str(caught.value)
    assert not (tmp_path / "dst").exists()


def test_an_int8_source_is_refused(contrib_int8_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelDirError, match="quantized weights"):
        convert_to_contrib(contrib_int8_dir, tmp_path / "dst")
