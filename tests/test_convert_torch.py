"""Converting real torch exports: tiny random transformers Llama and Qwen2 models exported with
torch.onnx.export (the TorchScript exporter Optimum uses), converted to the contrib layout, give
transformers' own fp32 logits, and the int8 conversion decodes batched bit-identically.

Needs torch and transformers: run in the build venv (.venv-train, see .ci/run); without them the
module skips with a message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from service.engine.convert import convert_to_contrib
from service.engine.model_files import MODEL_FILE
from service.engine.onnx_engine import OnnxEngine
from tests.engine_fixtures import assert_batch_invariant, greedy, prefilled_logits

torch = pytest.importorskip("torch", reason="torch is not installed: run in the build venv (.venv-train; .ci/run)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed: run in .venv-train")

SHAPE = {
    "vocab_size": 1000,  # tests.engine_fixtures.prompt draws ids below 1000
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}
PROMPTS = [[5], [17, 230, 4, 999, 12, 88, 301], list(range(40, 640, 25))]


def _export(arch: str, out: Path, *, tied: bool, randomize: bool) -> Any:
    """A random `arch` model saved as config.json + model.onnx (input_ids, attention_mask -> logits)."""
    torch.manual_seed(0)
    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }[arch]
    config = config_cls(**SHAPE, tie_word_embeddings=tied, use_cache=False, attn_implementation="eager")
    model = model_cls(config).eval()
    if randomize:  # freshly initialised norms are all ones and biases zero: they would not test the mapping
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.add_(torch.randn_like(param) * (0.2 if "norm" in name or "bias" in name else 0.03))
    out.mkdir(parents=True)
    config.save_pretrained(out)
    ids = torch.tensor([PROMPTS[1]])
    torch.onnx.export(
        model,
        (ids, torch.ones_like(ids)),
        str(out / MODEL_FILE),
        input_names=["input_ids", "attention_mask"],
        output_names=["logits"],
        dynamic_axes={name: {0: "batch", 1: "seq"} for name in ("input_ids", "attention_mask", "logits")},
        opset_version=17,
        dynamo=False,
    )
    return model


def _next_token_logits(model_dir: Path, ids: list[int]) -> np.ndarray:
    eng = OnnxEngine(model_dir, intra_op_threads=1)
    eng.add_sequence("s", ids, greedy(1))
    return np.asarray(prefilled_logits(eng, "s")).reshape(-1).copy()


def _reference(model: Any, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return np.asarray(model(torch.tensor([ids]))[0][0, -1].float().numpy())


@pytest.mark.parametrize(
    ("arch", "tied", "randomize"),
    [("llama", False, False), ("qwen2", True, True), ("llama", True, True)],
    ids=["llama-fresh", "qwen2-biases-tied", "llama-tied"],
)
def test_a_torch_export_converts_to_transformers_logits(arch: str, tied: bool, randomize: bool, tmp_path: Path) -> None:
    model = _export(arch, tmp_path / "export", tied=tied, randomize=randomize)
    ops = {node.op_type for node in onnx.load(str(tmp_path / "export" / MODEL_FILE)).graph.node}
    assert "GroupQueryAttention" not in ops and "MatMul" in ops
    fp32 = convert_to_contrib(tmp_path / "export", tmp_path / "fp32", quantize=False)
    int8 = convert_to_contrib(tmp_path / "export", tmp_path / "int8")
    for ids in PROMPTS:
        want = _reference(model, ids)
        scale = float(np.abs(want).max())
        np.testing.assert_allclose(_next_token_logits(fp32, ids), want, rtol=0, atol=1e-4 * scale)
        assert np.abs(_next_token_logits(int8, ids) - want).max() < 0.05 * scale


def test_a_converted_qwen2_export_decodes_batched_bit_identically(tmp_path: Path) -> None:
    _export("qwen2", tmp_path / "export", tied=True, randomize=True)
    assert_batch_invariant(convert_to_contrib(tmp_path / "export", tmp_path / "int8"))
