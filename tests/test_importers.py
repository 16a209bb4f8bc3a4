"""Importing Hugging Face safetensors checkpoints without torch: checkpoints written here with numpy and
safetensors (bf16 and float32, one file or sharded), imported by service/engine/importers, compared with the
float64 reference forward (weights.reference_forward); refusals in one line; int4 blocks; the model cache
keyed by the checkpoint's content. The transformers comparisons are in tests/test_import_hf.py (torch venv)."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import save_file

from service.config import Settings
from service.engine.config import INT8_PER_ROW, DecoderConfig, default_int8_block, read_config
from service.engine.cpu import cpu_features
from service.engine.graph_contrib import MS, quantize_blockwise_int4
from service.engine.importers import import_checkpoint
from service.engine.importers.checkpoint import Checkpoint
from service.engine.importers.dense import UnsupportedCheckpoint
from service.engine.info import decoding, model_info
from service.engine.model_dir import HASH_MEMO, ensure_imported_model, is_checkpoint_dir
from service.engine.model_files import ModelDirError
from service.engine.onnx_engine import OnnxEngine
from service.engine.weights import random_weights, reference_forward, rope_tables
from service.models import resolve_model_dir
from tests.cli_helpers import assert_one_line_error, run_cli
from tests.engine_fixtures import assert_batch_invariant, prompt_logits

SHAPE = DecoderConfig(
    vocab_size=1000,  # tests.engine_fixtures.prompt draws ids below 1000
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    intermediate_size=128,
    max_position=128,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_embeddings=False,
)
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
PROMPTS = [[5], [17, 230, 4, 999, 12, 88, 301], list(range(40, 640, 14))]


def hf_config(model_type: str, config: DecoderConfig = SHAPE, **more: Any) -> dict[str, Any]:
    """config.json as transformers writes it for `model_type` (transformers 5 spelling: rope_parameters)."""
    arch = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}.get(model_type, "Phi3")
    return {
        "architectures": [f"{arch}ForCausalLM"],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.intermediate_size,
        "max_position_embeddings": config.max_position,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "tie_word_embeddings": config.tie_embeddings,
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": [2, 3],
        "dtype": "bfloat16",
        **more,
    }


def hf_weights(config: DecoderConfig, *, biases: bool = False, qk_norms: bool = False) -> dict[str, np.ndarray]:
    """Random weights in HF names, with gains and biases away from 1 and 0 so that a mix-up shows."""
    w = random_weights(config, seed=11)
    rng = np.random.default_rng(12)
    for i in range(config.num_layers):
        p = f"model.layers.{i}.self_attn."
        for m, heads in (("q", config.num_heads), ("k", config.num_kv_heads), ("v", config.num_kv_heads)):
            if biases:
                w[p + f"{m}_proj.bias"] = rng.normal(0, 0.2, heads * config.head_dim).astype(np.float32)
            if qk_norms and m != "v":
                w[p + f"{m}_norm.weight"] = rng.normal(1, 0.2, config.head_dim).astype(np.float32)
    return w


def write_checkpoint(
    path: Path, cfg: dict[str, Any], weights: dict[str, np.ndarray], *, bf16: bool = True, shards: int = 1
) -> dict[str, np.ndarray]:
    """config.json + safetensors (bf16 by default, sharded with an index when `shards` > 1); returns the
    weights as the checkpoint holds them, in float32."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(cfg))
    stored = {n: a.astype(ml_dtypes.bfloat16) if bf16 else a for n, a in weights.items()}
    names = list(stored)
    if shards == 1:
        save_file(stored, str(path / "model.safetensors"))
    else:
        weight_map: dict[str, str] = {}
        for s in range(shards):
            file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = names[s::shards]
            save_file({n: stored[n] for n in part}, str(path / file))
            weight_map |= dict.fromkeys(part, file)
        (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return {n: np.asarray(a, dtype=np.float32) for n, a in stored.items()}


def decoder(model_dir: Path) -> DecoderConfig:
    return read_config(model_dir).decoder


def cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    """`python -m service ARGS` in this process (the subprocess costs seconds of imports): status, out, err."""
    from service.__main__ import main

    status = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return status, out, err


def one_line_error(result: tuple[int, str, str], *fragments: str) -> str:
    status, _, err = result
    lines = err.strip().splitlines()
    assert status == 1 and len(lines) == 1 and lines[0].startswith("error: "), result
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.mark.parametrize(
    ("model_type", "more", "biases", "qk_norms"),
    [
        ("llama", {"rope_scaling": LLAMA3}, False, False),
        ("mistral", {"sliding_window": 8}, False, False),
        ("qwen2", {"use_sliding_window": False, "sliding_window": 4096}, True, False),
        ("qwen3", {"attention_bias": False}, False, True),
    ],
)
def test_an_fp32_import_computes_the_reference_forward(
    model_type: str, more: dict[str, Any], biases: bool, qk_norms: bool, tmp_path: Path
) -> None:
    """bf16 weights read exactly, each family's particulars (llama3 RoPE scaling, Mistral's window of 8 over
    prompts of 43, Qwen2's biases, Qwen3's q/k norms) as the float64 reference computes them."""
    stored = write_checkpoint(
        tmp_path / "ckpt", hf_config(model_type, **more), hf_weights(SHAPE, biases=biases, qk_norms=qk_norms)
    )
    out = import_checkpoint(tmp_path / "ckpt", tmp_path / "fp32", bits=32)
    config = decoder(out)
    if model_type == "llama":
        assert config.rope_scale == {"rope_type": "llama3", "factor": 8.0, **{k: LLAMA3[k] for k in list(LLAMA3)[2:]}}
        assert not np.allclose(rope_tables(config)[0], rope_tables(SHAPE)[0])  # the scaling changes the tables
    assert config.attention_window == (8 if model_type == "mistral" else 0)
    for ids in PROMPTS:
        want = reference_forward(config, stored, np.asarray(ids))[-1]
        np.testing.assert_allclose(prompt_logits(out, ids), want, rtol=0, atol=1e-4 * float(np.abs(want).max()))


def test_the_import_records_its_source_and_carries_the_tokenizer(tmp_path: Path) -> None:
    src = tmp_path / "ckpt"
    write_checkpoint(src, hf_config("qwen2"), hf_weights(SHAPE, biases=True), shards=3)
    (src / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    (src / "generation_config.json").write_text('{"eos_token_id": [2, 3]}')
    (src / "original").mkdir()
    (src / "original" / "consolidated.00.pth").write_bytes(b"torch weights")
    out = import_checkpoint(src, tmp_path / "int8")
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.onnx",
        "tokenizer_config.json",
    ]
    meta = read_config(out)
    assert meta.model_id == "ckpt" and meta.stop_token_ids == [2, 3]
    source = meta.extra["source"]
    assert source["model_type"] == "qwen2" and source["architecture"] == "Qwen2ForCausalLM"
    assert source["dtypes"] == {"BF16": len(hf_weights(SHAPE, biases=True))}
    assert len(source["files"]) == 3 and len(source["sha256"]) == 64
    with Checkpoint(src) as ckpt:
        assert (
            source["parameters"]
            == ckpt.parameter_count()
            == sum(a.size for a in hf_weights(SHAPE, biases=True).values())
        )
        assert source["sha256"] == ckpt.content_hash()
    info = model_info(out)
    assert info["source"] == source and info["parameters"] == source["parameters"]
    with pytest.raises(ModelDirError, match="is a Hugging Face checkpoint, not a model directory: `python -m service"):
        model_info(src)
    assert info["decoding"]["batch_invariant"] is True


def test_a_checkpoint_in_the_hugging_face_cache_is_named_by_its_repository(tmp_path: Path) -> None:
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen2.5-0.5B-Instruct" / "snapshots" / "a1b2c3"
    snapshot.parent.mkdir(parents=True)
    write_checkpoint(snapshot, hf_config("qwen2"), hf_weights(SHAPE, biases=True))
    out = import_checkpoint(snapshot, tmp_path / "out", bits=32)
    assert read_config(out).model_id == "Qwen/Qwen2.5-0.5B-Instruct"


def test_int8_and_int4_imports_decode_batched_bit_identically(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "ckpt", hf_config("qwen3"), hf_weights(SHAPE, qk_norms=True))
    int8 = import_checkpoint(tmp_path / "ckpt", tmp_path / "int8")
    per_row = default_int8_block() == INT8_PER_ROW  # the layout chosen for this CPU
    assert read_config(int8).extra["quantization"]["scheme"] == ("rows_int8" if per_row else "matmulnbits_int8")
    assert_batch_invariant(int8)
    int4 = import_checkpoint(tmp_path / "ckpt", tmp_path / "int4", bits=4)
    assert read_config(int4).extra["quantization"]["scheme"] == "matmulnbits_int4"
    if not cpu_features().has_vnni:
        pytest.skip("int4 MatMulNBits is batch-invariant on VNNI CPUs only (measured); this CPU has none")
    assert_batch_invariant(int4)


def test_an_int4_import_decodes_one_sequence_at_a_time_without_vnni(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where int4's batch invariance is not measured (no VNNI), the engine does not batch it, as for QMoE int4."""
    import service.engine.onnx_engine as onnx_engine

    write_checkpoint(tmp_path / "ckpt", hf_config("qwen2"), hf_weights(SHAPE, biases=True))
    int4 = import_checkpoint(tmp_path / "ckpt", tmp_path / "int4", bits=4)
    int8 = import_checkpoint(tmp_path / "ckpt", tmp_path / "int8", block=32)  # what an import there would write
    no_vnni = dataclasses.replace(cpu_features(), avx512_vnni=False, avx_vnni=False, amx_int8=False)
    monkeypatch.setattr(onnx_engine, "cpu_features", lambda: no_vnni)
    assert OnnxEngine(int4, intra_op_threads=1, max_batch=16).max_batch == 1
    assert OnnxEngine(int8, intra_op_threads=1, max_batch=16).max_batch == 16
    assert decoding(read_config(int4).extra, cpu=no_vnni)["batched"] is False
    assert (
        decoding(read_config(int4).extra, cpu=cpu_features()).get("batch_invariant", False) is cpu_features().has_vnni
    )


def test_int4_blocks_dequantize_close_and_rows_do_not_depend_on_the_batch() -> None:
    k, n, block = 96, 80, 32
    w = np.random.default_rng(0).standard_normal((n, k)).astype(np.float32)
    packed, scales = quantize_blockwise_int4(w, block)
    assert packed.shape == (n, k // block, block // 2) and packed.dtype == np.uint8
    codes = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(n, k // block, block).astype(np.float32) - 8
    back = (codes * scales.reshape(n, -1, 1)).reshape(n, k)
    # Within half a step, but for values opposite a block's peak beyond +7 steps (the peak maps to -8): one step.
    err = np.abs(back - w).reshape(n, -1, block)
    step = np.abs(scales).reshape(n, -1, 1)
    assert np.all(err <= step + 1e-6) and np.mean(err <= step / 2 + 1e-6) > 0.99
    node = helper.make_node(
        "MatMulNBits", ["x", "q", "s"], ["y"], domain=MS, K=k, N=n, bits=4, block_size=block, accuracy_level=4
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", n])],
        [numpy_helper.from_array(packed, "q"), numpy_helper.from_array(scales, "s")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((16, k)).astype(np.float32)
    batched = sess.run(None, {"x": x})[0]
    np.testing.assert_allclose(batched, x @ back.T, atol=0.05 * float(np.abs(x @ back.T).max()))
    if cpu_features().has_vnni:
        alone = np.concatenate([sess.run(None, {"x": x[i : i + 1]})[0] for i in range(16)])
        assert np.array_equal(batched, alone)


def test_an_unsupported_architecture_is_refused_in_one_line(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "ckpt", hf_config("phi3"), hf_weights(SHAPE))
    result = run_cli("model", "import", str(tmp_path / "ckpt"), str(tmp_path / "out"))
    assert_one_line_error(result, "model_type 'phi3'", "Phi3ForCausalLM", "supported: llama, mistral, qwen2, qwen3")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("model_type", "more", "expected"),
    [
        ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "RoPE scaling 'yarn'"),
        ("llama", {"attention_bias": True}, "attention biases"),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 64}, "sliding-window attention"),
        ("llama", {"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ("qwen3", {"quantization_config": {"quant_method": "gptq"}}, "quantized already (gptq)"),
    ],
)
def test_what_the_graph_cannot_express_is_refused(
    model_type: str, more: dict[str, Any], expected: str, tmp_path: Path
) -> None:
    write_checkpoint(tmp_path / "ckpt", hf_config(model_type, **more), hf_weights(SHAPE))
    with pytest.raises(UnsupportedCheckpoint, match="cannot be imported") as err:
        import_checkpoint(tmp_path / "ckpt", tmp_path / "out")
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


def test_missing_tensors_are_listed_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    weights = hf_weights(SHAPE, biases=True)
    gone = [n for n in weights if n.endswith("q_proj.bias") or n.startswith("model.layers.1.mlp.")]
    write_checkpoint(tmp_path / "ckpt", hf_config("qwen2"), {n: a for n, a in weights.items() if n not in gone})
    result = cli(capsys, "model", "import", tmp_path / "ckpt", tmp_path / "out")
    line = one_line_error(result, f"missing {len(gone)} tensor(s)", "model.layers.0.self_attn.q_proj.bias")
    assert "... (" not in line  # 5 names: all listed
    many = [n for n in weights if ".layers." in n]
    write_checkpoint(tmp_path / "few", hf_config("llama"), {n: a for n, a in weights.items() if n not in many})
    with pytest.raises(
        ModelDirError, match=rf"missing {len([n for n in many if 'bias' not in n])} tensor\(s\).*more\)"
    ):
        import_checkpoint(tmp_path / "few", tmp_path / "out")


def test_misshapen_and_unplaceable_tensors_are_refused(tmp_path: Path) -> None:
    weights = hf_weights(SHAPE)
    weights["model.norm.weight"] = weights["model.norm.weight"][:10]
    write_checkpoint(tmp_path / "bad", hf_config("llama"), weights)
    with pytest.raises(ModelDirError, match=r"misshapen: model.norm.weight \(10,\) \(expected \(64,\)\)"):
        import_checkpoint(tmp_path / "bad", tmp_path / "out")
    weights = hf_weights(SHAPE)
    weights["model.layers.0.self_attn.o_proj.bias"] = np.zeros(64, np.float32)  # a bias the graph would drop
    write_checkpoint(tmp_path / "extra", hf_config("llama"), weights)
    with pytest.raises(ModelDirError, match="no place for: model.layers.0.self_attn.o_proj.bias"):
        import_checkpoint(tmp_path / "extra", tmp_path / "out")


def test_tied_embeddings_read_the_head_from_the_embedding(tmp_path: Path) -> None:
    tied = DecoderConfig(**{**SHAPE.to_dict(), "tie_embeddings": True})
    stored = write_checkpoint(tmp_path / "ckpt", hf_config("llama", tied), hf_weights(tied), bf16=False)
    out = import_checkpoint(tmp_path / "ckpt", tmp_path / "fp32", bits=32)
    assert decoder(out).tie_embeddings and "lm_head.weight" not in stored
    want = reference_forward(decoder(out), stored, np.asarray(PROMPTS[1]))[-1]
    np.testing.assert_allclose(prompt_logits(out, PROMPTS[1]), want, rtol=0, atol=1e-4 * float(np.abs(want).max()))


def test_a_large_import_streams_its_tensors_to_a_data_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past a size (here lowered), tensors of 1 MiB or more are written to model.onnx.data as the graph is made
    (graph_gptoss.ExternalWriter), never all in memory; the result computes the same."""
    import service.engine.model_files as model_files

    monkeypatch.setattr(model_files, "EXTERNAL_DATA_THRESHOLD", 1024)
    wide = DecoderConfig(**{**SHAPE.to_dict(), "vocab_size": 5000})  # a 1.28 MB float32 embedding
    stored = write_checkpoint(tmp_path / "ckpt", hf_config("llama", wide), hf_weights(wide))
    out = import_checkpoint(tmp_path / "ckpt", tmp_path / "fp32", bits=32)
    assert (out / "model.onnx.data").stat().st_size >= 5000 * 64 * 4
    want = reference_forward(decoder(out), stored, np.asarray(PROMPTS[1]))[-1]
    np.testing.assert_allclose(prompt_logits(out, PROMPTS[1]), want, rtol=0, atol=1e-4 * float(np.abs(want).max()))
    assert_batch_invariant(import_checkpoint(tmp_path / "ckpt", tmp_path / "int8"))


def test_bits_and_block_sizes_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_checkpoint(tmp_path / "ckpt", hf_config("llama"), hf_weights(SHAPE))
    command = ("model", "import", tmp_path / "ckpt", tmp_path / "out")
    result = cli(capsys, *command, "--bits", "4", "--block-size", "64")
    one_line_error(result, "int4 weights decode batch-invariantly only in blocks of 16, 32")
    one_line_error(cli(capsys, *command, "--fp32", "--block-size", "row"), "--block-size is for quantized imports")
    status, out, err = cli(capsys, *command, "--block-size", "row")
    assert status == 0, err
    assert read_config(tmp_path / "out").extra["quantization"]["scheme"] == "rows_int8"
    assert "SERVICE_MODEL=" in out and "importing: 100%" in err  # the progress bar


def test_the_served_context_is_capped(tmp_path: Path) -> None:
    long = DecoderConfig(**{**SHAPE.to_dict(), "max_position": 131_072})
    write_checkpoint(tmp_path / "ckpt", hf_config("llama", long), hf_weights(SHAPE))
    assert decoder(import_checkpoint(tmp_path / "ckpt", tmp_path / "a", bits=32)).max_position == 32_768
    assert decoder(import_checkpoint(tmp_path / "ckpt", tmp_path / "b", bits=32, max_context=512)).max_position == 512


def test_service_model_imports_a_checkpoint_once_into_the_cache(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, cache = tmp_path / "Qwen2.5-tiny", tmp_path / "cache"
    weights = hf_weights(SHAPE, biases=True)
    write_checkpoint(src, hf_config("qwen2"), weights)
    assert is_checkpoint_dir(src) and not is_checkpoint_dir(cache)
    settings = Settings(database_url="sqlite+aiosqlite:///unused.db", model=src, model_cache=cache)
    with caplog.at_level(logging.INFO, logger="service.engine.model_dir"):
        first = resolve_model_dir(settings)
    assert first.parent == cache and first.name.startswith("Qwen2.5-tiny".join(["imported-", "-"]))
    assert "imported into" in caplog.text and read_config(first).extra["source"]["path"] == str(src.resolve())
    assert (cache / HASH_MEMO).is_file()
    written = (first / "model.onnx").stat().st_mtime_ns

    hashed: list[Path] = []
    import service.engine.importers.checkpoint as checkpoint

    real_sha256 = checkpoint._sha256

    def counted(path: Path) -> str:
        hashed.append(path)
        return real_sha256(path)

    monkeypatch.setattr(checkpoint, "_sha256", counted)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="service.engine.model_dir"):
        assert resolve_model_dir(settings) == first
    assert "imported before" in caplog.text and hashed == []  # the memo: no file read again
    assert (first / "model.onnx").stat().st_mtime_ns == written

    # Same shapes, other values (a fine-tune): another content hash, another import.
    (src / "model.safetensors").unlink()
    weights["model.norm.weight"] = weights["model.norm.weight"] * 2
    save_file({n: a.astype(ml_dtypes.bfloat16) for n, a in weights.items()}, str(src / "model.safetensors"))
    second = ensure_imported_model(src, cache, progress=False)
    assert second != first and len(hashed) == 1
    assert read_config(second).extra["source"]["sha256"] != read_config(first).extra["source"]["sha256"]


def test_service_model_names_a_checkpoint_it_cannot_import(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "ckpt", hf_config("phi3"), hf_weights(SHAPE))
    settings = Settings(database_url="sqlite+aiosqlite:///unused.db", model=tmp_path / "ckpt", model_cache=tmp_path)
    with pytest.raises(ModelDirError, match=r"^SERVICE_MODEL=.*model_type 'phi3'"):
        resolve_model_dir(settings)


def test_a_gpt_oss_checkpoint_is_imported_through_the_same_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """model_type gpt_oss goes to importers/gpt_oss.py (its own tests: tests/test_import_gptoss.py), 4-bit experts
    by default, with the same `source` record."""
    from tests.test_import_gptoss import TINY, write_mxfp4_checkpoint

    src = write_mxfp4_checkpoint(tmp_path / "gpt-oss-tiny", TINY)
    result = cli(capsys, "model", "import", src, tmp_path / "out", "--block-size", "32")
    one_line_error(result, "--block-size and --max-context are for dense checkpoints")
    status, _, err = cli(capsys, "model", "import", src, tmp_path / "out")
    assert status == 0, err[-2000:]
    meta = read_config(tmp_path / "out")
    assert meta.extra["quantization"]["expert_bits"] == 4
    assert meta.extra["source"]["model_type"] == "gpt_oss" and meta.extra["source"]["dtypes"]["U8"] > 0
    with Checkpoint(src) as ckpt:
        assert meta.extra["source"]["sha256"] == ckpt.content_hash()
