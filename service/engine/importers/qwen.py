"""Qwen2 / Qwen2.5 checkpoints (q/k/v biases, added after the fused projection) and Qwen3 (no biases; per-head
RMSNorms on q and k before RoPE), as transformers' Qwen2ForCausalLM and Qwen3ForCausalLM compute them. Their
configs carry a sliding window that is off (`use_sliding_window: false`); one that is on is refused."""

from __future__ import annotations

from typing import Any

from service.engine.importers.checkpoint import Checkpoint
from service.engine.importers.dense import (
    DenseModel,
    UnsupportedCheckpoint,
    check_dense,
    decoder_config,
    dense_weights,
    tied_embeddings,
)

MODEL_TYPES = ("qwen2", "qwen3")


def read_qwen(ckpt: Checkpoint, *, max_context: int | None = None) -> DenseModel:
    """A `qwen2` or `qwen3` checkpoint as graph_contrib's shape and weights."""
    cfg = ckpt.config
    check_dense(cfg)
    _check_full_attention(cfg)
    qwen3 = ckpt.model_type == "qwen3"
    if qwen3 and cfg.get("attention_bias"):
        raise UnsupportedCheckpoint("attention biases on every projection (o_proj included)")
    config, extra = decoder_config(cfg, tied=tied_embeddings(cfg, ckpt), max_context=max_context)
    return DenseModel(config, dense_weights(ckpt, config, biases=not qwen3, qk_norms=qwen3), extra)


def _check_full_attention(cfg: dict[str, Any]) -> None:
    sliding = cfg.get("use_sliding_window") or "sliding_attention" in (cfg.get("layer_types") or [])
    if sliding:
        raise UnsupportedCheckpoint(
            f"sliding-window attention on some layers (sliding_window {cfg.get('sliding_window')}, "
            f"max_window_layers {cfg.get('max_window_layers')})"
        )
