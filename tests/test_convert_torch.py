"""Converting real torch exports: tiny random transformers Llama and Qwen2 models exported with
torch.onnx.export (the TorchScript exporter Optimum uses; with the KV cache as inputs and outputs, the
layout Optimum writes, or without), converted to the contrib layout, give transformers' own fp32
logits, and the int8 conversion decodes batched bit-identically.

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


def _with_past(model: Any, config: Any) -> Any:
    """The decoder-with-past signature Optimum exports: input_ids, attention_mask, position_ids and
    past_key_values.{i}.key/.value in; logits and present.{i}.key/.value out."""

    module: Any = torch.nn.Module  # torch is optional: untyped here

    class WithPast(module):
        def __init__(self) -> None:
            super().__init__()
            self.model, self.lm_head, self.causal_lm = model.model, model.lm_head, model  # HF parameter names

        def forward(self, input_ids: Any, attention_mask: Any, position_ids: Any, *past: Any) -> tuple[Any, ...]:
            cache = transformers.DynamicCache(config=config)
            for i in range(config.num_hidden_layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.causal_lm(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, past_key_values=cache
            )
            present = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
            return (out.logits, *present)

    return WithPast()


def _export(arch: str, out: Path, *, tied: bool, randomize: bool, past: bool) -> Any:
    """A random `arch` model saved as config.json + model.onnx: input_ids, attention_mask (+ position_ids and
    the KV cache when `past`) -> logits (+ present)."""
    torch.manual_seed(0)
    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }[arch]
    config = config_cls(**SHAPE, tie_word_embeddings=tied, use_cache=past, attn_implementation="eager")
    model = model_cls(config).eval()
    if randomize:  # freshly initialised norms are all ones and biases zero: they would not test the mapping
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.add_(torch.randn_like(param) * (0.2 if "norm" in name or "bias" in name else 0.03))
    out.mkdir(parents=True)
    config.save_pretrained(out)
    ids = torch.tensor([PROMPTS[1]])
    args, names, outputs = (ids, torch.ones_like(ids)), ["input_ids", "attention_mask"], ["logits"]
    axes: dict[str, dict[int, str]] = {name: {0: "batch", 1: "seq"} for name in (*names, "logits")}
    module = model
    if past:
        layers, kv_heads = config.num_hidden_layers, config.num_key_value_heads
        head_dim = config.hidden_size // config.num_attention_heads
        kv = [torch.randn(1, kv_heads, 2, head_dim) for _ in range(2 * layers)]
        args = (ids, torch.ones(1, 2 + ids.shape[1], dtype=torch.long), torch.arange(2, 2 + ids.shape[1])[None], *kv)
        pasts = [f"past_key_values.{i}.{k}" for i in range(layers) for k in ("key", "value")]
        presents = [f"present.{i}.{k}" for i in range(layers) for k in ("key", "value")]
        names, outputs = [*names, "position_ids", *pasts], ["logits", *presents]
        axes |= {"attention_mask": {0: "batch", 1: "total"}, "position_ids": {0: "batch", 1: "seq"}}
        axes |= {n: {0: "batch", 2: "past"} for n in pasts} | {n: {0: "batch", 2: "total"} for n in presents}
        module = _with_past(model, config)
    torch.onnx.export(
        module,
        args,
        str(out / MODEL_FILE),
        input_names=names,
        output_names=outputs,
        dynamic_axes=axes,
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
    ("arch", "tied", "randomize", "past"),
    [("llama", False, False, True), ("qwen2", True, True, True), ("llama", True, True, False)],
    ids=["llama-fresh-with-past", "qwen2-biases-tied-with-past", "llama-tied-no-past"],
)
def test_a_torch_export_converts_to_transformers_logits(
    arch: str, tied: bool, randomize: bool, past: bool, tmp_path: Path
) -> None:
    model = _export(arch, tmp_path / "export", tied=tied, randomize=randomize, past=past)
    ops = {node.op_type for node in onnx.load(str(tmp_path / "export" / MODEL_FILE)).graph.node}
    assert "GroupQueryAttention" not in ops and "MatMul" in ops
    fp32 = convert_to_contrib(tmp_path / "export", tmp_path / "fp32", quantize=False)
    int8 = convert_to_contrib(tmp_path / "export", tmp_path / "int8")
    for ids in PROMPTS:
        want = _reference(model, ids)
        scale = float(np.abs(want).max())
        if past:  # the export itself is a decoder-with-past the engine serves (standard layout, one at a time)
            np.testing.assert_allclose(_next_token_logits(tmp_path / "export", ids), want, rtol=0, atol=1e-4 * scale)
        np.testing.assert_allclose(_next_token_logits(fp32, ids), want, rtol=0, atol=1e-4 * scale)
        assert np.abs(_next_token_logits(int8, ids) - want).max() < 0.05 * scale


def test_a_converted_qwen2_export_decodes_batched_bit_identically(tmp_path: Path) -> None:
    _export("qwen2", tmp_path / "export", tied=True, randomize=True, past=False)
    assert_batch_invariant(convert_to_contrib(tmp_path / "export", tmp_path / "int8"))
