"""Llama (1, 2, 3.x with `rope_type: llama3` scaling) and Mistral checkpoints: the Llama block graph_contrib writes
(RMSNorm, rotate-half RoPE, grouped-query attention, SiLU-gated MLP), as transformers' LlamaForCausalLM and
MistralForCausalLM compute it. Mistral's sliding window (v0.1: 4,096) is GroupQueryAttention's
local_window_size; later Mistral checkpoints have none."""

from __future__ import annotations

from service.engine.importers.checkpoint import Checkpoint
from service.engine.importers.dense import (
    DenseModel,
    UnsupportedCheckpoint,
    check_dense,
    decoder_config,
    dense_weights,
    tied_embeddings,
)

MODEL_TYPES = ("llama", "mistral")


def read_llama(ckpt: Checkpoint, *, max_context: int | None = None) -> DenseModel:
    """A `llama` or `mistral` checkpoint as graph_contrib's shape and weights; UnsupportedCheckpoint says what
    it cannot express (biases on every projection, a scaling other than llama3, mixed attention layers)."""
    cfg = ckpt.config
    check_dense(cfg)
    if cfg.get("attention_bias"):
        raise UnsupportedCheckpoint("attention biases on every projection (o_proj included)")
    layer_types = set(cfg.get("layer_types") or ["full_attention"])
    window = 0
    if ckpt.model_type == "mistral":
        window = int(cfg.get("sliding_window") or 0)
        layer_types.discard("sliding_attention")
    if layer_types - {"full_attention"}:
        raise UnsupportedCheckpoint(f"layer types {sorted(layer_types)} (only full attention)")
    config, extra = decoder_config(
        cfg, tied=tied_embeddings(cfg, ckpt), max_context=max_context, attention_window=window
    )
    return DenseModel(config, dense_weights(ckpt, config), extra)
