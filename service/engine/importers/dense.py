"""What the dense families share: the checkpoint's config read into a DecoderConfig, the checks that refuse
what graph_contrib cannot express exactly, the weights mapped to the names graph_contrib reads (read from
the checkpoint only when the writer asks, one at a time), and the write itself.

A family module (llama.py, qwen.py) says what is particular to it (biases, q/k norms, RoPE scaling,
sliding window) and returns a DenseModel; `write_dense` turns it into a model directory."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from service.engine.config import DecoderConfig, ModelMeta, write_config
from service.engine.importers.checkpoint import Checkpoint, abbreviated
from service.engine.model_files import ModelDirError

# The served context when the checkpoint allows more (Llama 3.1: 131,072): each generating run holds a KV cache
# of this many positions. `model import --max-context` chooses another.
DEFAULT_MAX_CONTEXT = 32_768
# Buffers some checkpoints store beside the weights, recomputed by the graph (RoPE's inverse frequencies).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class UnsupportedCheckpoint(ModelDirError):
    """A checkpoint whose architecture the importers cannot write exactly; the message says why, in one line."""


@dataclass
class DenseModel:
    """A dense decoder ready for graph_contrib: shape, weights by HF name, config.json metadata."""

    config: DecoderConfig
    weights: CheckpointWeights
    extra: dict[str, Any] = field(default_factory=dict)


class CheckpointWeights(Mapping[str, np.ndarray]):
    """The weights graph_contrib reads, by its HF name, read (as float32) from the checkpoint when asked: the
    writer holds one layer's float32 weights at a time, not the model's. Shapes are checked against the
    headers before anything is read."""

    def __init__(self, ckpt: Checkpoint, shapes: dict[str, tuple[int, ...]]) -> None:
        self.ckpt, self.shapes = ckpt, shapes
        self.on_read: Callable[[str], None] = lambda _name: None  # told each name read (the progress bar)
        ckpt.require(list(shapes))
        wrong = [f"{n} {ckpt.shape(n)} (expected {want})" for n, want in shapes.items() if ckpt.shape(n) != want]
        if wrong:
            raise ModelDirError(f"{ckpt.path} ({ckpt.architecture}): misshapen: {', '.join(abbreviated(wrong))}")

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.shapes:
            raise KeyError(name)
        array = self.ckpt.get(name)
        self.on_read(name)
        return array

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)

    def __contains__(self, name: object) -> bool:
        return name in self.shapes


def rope_settings(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """RoPE's theta and scaling from an HF config: `rope_scaling` (transformers 4) or `rope_parameters`
    (transformers 5), the scaling None for plain RoPE; UnsupportedCheckpoint for a scaling graph_contrib lacks."""
    params = dict(cfg.get("rope_parameters") or {})
    scaling = dict(cfg.get("rope_scaling") or params)
    theta = float(cfg.get("rope_theta") or params.get("rope_theta") or scaling.get("rope_theta") or 10000.0)
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise UnsupportedCheckpoint(f"RoPE scaling {kind!r} (supported: default, llama3)")
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    absent = [k for k in keys if k not in scaling]
    if absent:
        raise UnsupportedCheckpoint(f"llama3 RoPE scaling without {', '.join(absent)}")
    return theta, {"rope_type": "llama3", **{k: float(scaling[k]) for k in keys}}


def check_dense(cfg: dict[str, Any]) -> None:
    """What every dense family must be for graph_contrib: SiLU-gated MLP without biases, full rotary, weights
    not quantized already."""
    problems = []
    if cfg.get("quantization_config"):
        method = cfg["quantization_config"].get("quant_method", "unknown")
        problems.append(f"weights quantized already ({method}); import the unquantized checkpoint")
    if cfg.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {cfg['hidden_act']!r} (only silu)")
    if cfg.get("mlp_bias"):
        problems.append("MLP biases")
    if cfg.get("partial_rotary_factor", 1.0) != 1.0:
        problems.append(f"partial_rotary_factor {cfg['partial_rotary_factor']}")
    if problems:
        raise UnsupportedCheckpoint("; ".join(problems))


def decoder_config(
    cfg: dict[str, Any], *, tied: bool, max_context: int | None, attention_window: int = 0
) -> tuple[DecoderConfig, dict[str, Any]]:
    """The DecoderConfig of an HF config (and config.json's metadata: every end-of-sequence id)."""
    theta, scale = rope_settings(cfg)
    try:
        heads, hidden = int(cfg["num_attention_heads"]), int(cfg["hidden_size"])
        trained = int(cfg.get("max_position_embeddings") or 2048)
        context = min(trained, max_context or DEFAULT_MAX_CONTEXT)
        eos = cfg.get("eos_token_id")
        eos_ids = [int(t) for t in eos] if isinstance(eos, list) else [] if eos is None else [int(eos)]
        config = DecoderConfig(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            intermediate_size=int(cfg["intermediate_size"]),
            max_position=context,
            rope_theta=theta,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            tie_embeddings=tied,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=eos_ids[0] if eos_ids else None,
            rope_scale=scale,
            attention_window=attention_window if 0 < attention_window < context else 0,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise UnsupportedCheckpoint(f"config.json does not describe a decoder: {exc!r}") from exc
    return config, {"eos_token_ids": eos_ids} if len(eos_ids) > 1 else {}


def tied_embeddings(cfg: dict[str, Any], ckpt: Checkpoint) -> bool:
    """Whether the head is the embedding table: config.json says so; where it does not, no lm_head.weight."""
    if "tie_word_embeddings" in cfg:
        return bool(cfg["tie_word_embeddings"])
    return "lm_head.weight" not in ckpt


def dense_weights(
    ckpt: Checkpoint, config: DecoderConfig, *, biases: bool = False, qk_norms: bool = False
) -> CheckpointWeights:
    """The weights graph_contrib reads for `config`, checked against the checkpoint: missing tensors listed by
    name, misshapen ones with their shapes, and tensors the layout has no place for refused (an o_proj bias
    would otherwise be dropped silently)."""
    c, h, d = config, config.hidden_size, config.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, h), "model.norm.weight": (h,)}
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        for m, out in {"q": c.num_heads * d, "k": c.num_kv_heads * d, "v": c.num_kv_heads * d}.items():
            shapes[p + f"self_attn.{m}_proj.weight"] = (out, h)
            if biases:
                shapes[p + f"self_attn.{m}_proj.bias"] = (out,)
            if qk_norms and m != "v":
                shapes[p + f"self_attn.{m}_norm.weight"] = (d,)
        shapes[p + "self_attn.o_proj.weight"] = (h, c.num_heads * d)
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "mlp.gate_proj.weight"] = (c.intermediate_size, h)
        shapes[p + "mlp.up_proj.weight"] = (c.intermediate_size, h)
        shapes[p + "mlp.down_proj.weight"] = (h, c.intermediate_size)
    if not c.tie_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, h)
    weights = CheckpointWeights(ckpt, shapes)
    unused = sorted(
        n
        for n in ckpt.names()
        if n not in shapes and not n.endswith(_IGNORED_SUFFIXES) and not (c.tie_embeddings and n == "lm_head.weight")
    )
    if unused:
        raise ModelDirError(
            f"{ckpt.path} ({ckpt.architecture}): tensors the contrib layout has no place for: "
            f"{', '.join(abbreviated(unused))}"
        )
    return weights


def write_dense(
    out_dir: Path,
    model: DenseModel,
    *,
    bits: int,
    block: int,
    extra: dict[str, Any],
) -> Path:
    """graph_contrib's graph of `model` (fp32 for bits 32, else int8 or int4 in blocks of `block`) and
    config.json into `out_dir`."""
    import onnx

    from service.engine.graph_contrib import build_contrib_graph, contrib_int4_scheme
    from service.engine.graph_gptoss import ExternalWriter
    from service.engine.model_files import EXTERNAL_DATA_THRESHOLD, MODEL_FILE, save_model
    from service.engine.quantize import contrib_int8_scheme

    quantize = bits != 32
    # Tensors of 1 MiB or more go to model.onnx.data as they are made: the graph is never whole in memory (a
    # protobuf graph would also be copied whole when assembled). Small models stay one file.
    external = model.config.parameter_count() * (4 if bits == 32 else 1) > EXTERNAL_DATA_THRESHOLD // 4
    writer = ExternalWriter(out_dir / (MODEL_FILE + ".data")) if external else None
    try:
        graph = build_contrib_graph(
            model.config, model.weights, quantize=quantize, block=block, bits=min(bits, 8), writer=writer
        )
    finally:
        if writer is not None:
            writer.close()
    if writer is not None:
        onnx.save_model(graph, str(out_dir / MODEL_FILE))  # the large tensors are in the data file already
    else:
        save_model(graph, out_dir / MODEL_FILE)
    del graph
    scheme = None if not quantize else contrib_int4_scheme(block) if bits == 4 else contrib_int8_scheme(block)
    meta = {
        "format": "onnx-decoder-with-past",
        "graph": "contrib",
        "kv_cache": "shared_buffer",
        "logits": "last_position",
        "quantization": scheme,
        **model.extra,
        **extra,
    }
    write_config(out_dir, ModelMeta(model.config, meta))
    return out_dir
