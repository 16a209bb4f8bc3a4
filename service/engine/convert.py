"""A standard-op fp32 decoder (ours, or a torch/Optimum export) rewritten in the contrib layout, int8.

The standard layout (Concat KV cache, onnxruntime's dynamic int8) is not batch-invariant, so the engine
steps its sequences one at a time. The contrib layout (GroupQueryAttention on a shared KV buffer,
MatMulNBits int8 at accuracy level 4) decodes a batch with each row's logits bit-identical to decoding
it alone. This module reads the source's weights back in HF names, checks that graph_contrib can
express the architecture, and writes the graph `build-random` writes for those weights, with the
source's tokenizer, chat template and generation config, into a new directory renamed into place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx

from service.engine.builder import write_contrib_model
from service.engine.config import CONFIG_FILE, GENAI_CONFIG_FILE, INT8_BLOCK_SIZE, DecoderConfig, read_config
from service.engine.export_weights import weights_from_export
from service.engine.graph_contrib import check_block_size
from service.engine.graph_standard import weights_from_standard
from service.engine.model_files import (
    QUANTIZED_OPS,
    ModelDirError,
    copy_support_files,
    find_model_file,
    graph_files,
    new_directory,
)
from service.engine.quantize import AlreadyQuantized

# HF model types whose decoder is the Llama block graph_contrib writes (RMSNorm, rotate-half RoPE,
# GQA, SiLU-gated MLP). Qwen2 adds q/k/v biases, which graph_contrib adds after the fused projection.
SUPPORTED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2"})
# config.json keys that describe the graph, rewritten for the converted model.
_GRAPH_KEYS = ("format", "graph", "kv_cache", "logits", "quantization", "io_names")


def convert_to_contrib(src_dir: Path, dst_dir: Path, *, quantize: bool = True, block: int = INT8_BLOCK_SIZE) -> Path:
    """Write the contrib-layout model (int8 MatMulNBits in blocks of `block` when `quantize`) of the fp32
    standard-op decoder in `src_dir` to the new directory `dst_dir`. ModelDirError says what does not fit."""
    check_block_size(block)
    src_dir, dst_dir = Path(src_dir), Path(dst_dir)
    src = find_model_file(src_dir)
    meta = read_config(src_dir)
    check_architecture(meta.extra, src_dir)
    model = _load(src)
    weights = read_weights(model, meta.decoder, ours=meta.extra.get("graph") == "standard", where=src)
    extra: dict[str, Any] = {k: v for k, v in meta.extra.items() if k not in _GRAPH_KEYS}
    extra["converted_from"] = {"graph": meta.extra.get("graph", "standard-op export"), "file": src.name}
    with new_directory(dst_dir) as tmp:
        write_contrib_model(tmp, meta.decoder, weights, quantize=quantize, extra=extra, block=block)
        # genai_config.json describes the source's graph (names, buffer sharing), not ours: it stays behind.
        copy_support_files(src_dir, tmp, skip=graph_files(src_dir) | {CONFIG_FILE, GENAI_CONFIG_FILE})
    return dst_dir


class AlreadyContrib(ModelDirError):
    """The source graph is in the contrib layout already: nothing to convert, only to quantize."""


def check_architecture(config: dict[str, Any], src_dir: Path) -> None:
    """Refuse, with the reason, a config whose model graph_contrib cannot express exactly."""
    problems = []
    model_type = config.get("model_type")
    if model_type is not None and model_type not in SUPPORTED_MODEL_TYPES:
        supported = ", ".join(sorted(SUPPORTED_MODEL_TYPES))
        problems.append(f"model_type {model_type!r} (supported: {supported})")
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        problems.append(f"RoPE scaling {rope.get('rope_type', rope.get('type'))!r} (only plain RoPE)")
    if config.get("partial_rotary_factor", 1.0) != 1.0:
        problems.append(f"partial_rotary_factor {config['partial_rotary_factor']}")
    if config.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {config['hidden_act']!r} (only silu)")
    if config.get("mlp_bias"):
        problems.append("MLP biases")
    if model_type != "qwen2" and config.get("attention_bias"):
        problems.append("attention biases on every projection")
    if _sliding(config):
        problems.append(f"sliding-window attention ({config.get('sliding_window')} tokens)")
    if problems:
        raise ModelDirError(f"{src_dir} cannot be converted to the contrib layout: {'; '.join(problems)}")


def _sliding(config: dict[str, Any]) -> bool:
    window = config.get("sliding_window")
    if window is None or config.get("use_sliding_window") is False:
        return False
    return int(window) < int(config.get("max_position_embeddings") or config.get("max_position") or 0)


def _load(src: Path) -> onnx.ModelProto:
    try:
        model = onnx.load(str(src))
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends: the file is not a graph
        raise ModelDirError(f"{src} is not an ONNX graph: {' '.join(str(exc).split())}") from exc
    ops = {node.op_type for node in model.graph.node}
    if ops & QUANTIZED_OPS:
        found = ", ".join(sorted(ops & QUANTIZED_OPS))
        raise AlreadyQuantized(f"{src} holds quantized weights ({found}); convert the fp32 model")
    if "GroupQueryAttention" in ops:
        raise AlreadyContrib(f"{src} is in the contrib layout already; `model quantize` it without --layout")
    inputs = {i.name for i in model.graph.input}
    outputs = {o.name for o in model.graph.output}
    if "input_ids" not in inputs or "logits" not in outputs:
        raise ModelDirError(
            f"{src} is not a decoder graph (it needs input_ids in and logits out): "
            f"inputs {sorted(inputs)}, outputs {sorted(outputs)}"
        )
    return model


def expected_shapes(config: DecoderConfig, *, biases: bool) -> dict[str, tuple[int, ...]]:
    """Every weight the contrib graph needs, by HF name, with its HF shape."""
    c, h, d = config, config.hidden_size, config.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, h), "model.norm.weight": (h,)}
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        projections = {"q": c.num_heads * d, "k": c.num_kv_heads * d, "v": c.num_kv_heads * d}
        for m, out in projections.items():
            shapes[p + f"self_attn.{m}_proj.weight"] = (out, h)
            if biases:
                shapes[p + f"self_attn.{m}_proj.bias"] = (out,)
        shapes[p + "self_attn.o_proj.weight"] = (h, c.num_heads * d)
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "mlp.gate_proj.weight"] = (c.intermediate_size, h)
        shapes[p + "mlp.up_proj.weight"] = (c.intermediate_size, h)
        shapes[p + "mlp.down_proj.weight"] = (h, c.intermediate_size)
    if not c.tie_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, h)
    return shapes


def read_weights(model: onnx.ModelProto, config: DecoderConfig, *, ours: bool, where: Path) -> dict[str, np.ndarray]:
    """The weights graph_contrib needs, by HF name; ModelDirError listing any that are missing or misshapen."""
    found = weights_from_standard(model, config) if ours else weights_from_export(model)
    biases = any(name.endswith("_proj.bias") for name in found)
    needed = expected_shapes(config, biases=biases)
    missing = [name for name in needed if name not in found]
    wrong = [
        f"{n} {found[n].shape} (expected {needed[n]})" for n in needed if n in found and found[n].shape != needed[n]
    ]
    if missing or wrong:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} weight(s): {', '.join(_abbreviated(missing))}")
        if wrong:
            parts.append(f"misshapen: {', '.join(_abbreviated(wrong))}")
        raise ModelDirError(f"{where}: cannot read the decoder's weights: {'; '.join(parts)}")
    unused = sorted(n for n in found if n not in needed and not n.startswith("lm_head."))
    if unused:  # e.g. an o_proj bias or q/k norms: weights graph_contrib would silently drop
        raise ModelDirError(f"{where}: weights the contrib layout has no place for: {', '.join(_abbreviated(unused))}")
    return {name: np.ascontiguousarray(found[name], dtype=np.float32) for name in needed}


def _abbreviated(names: list[str], limit: int = 8) -> list[str]:
    return names if len(names) <= limit else [*names[:limit], f"... ({len(names) - limit} more)"]
