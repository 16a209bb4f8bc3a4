"""Deterministic random weights for a Llama-style decoder, in Hugging Face names and layout ([out, in]); RoPE
tables; the float64 reference forward the graphs are tested against."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from service.engine.config import DecoderConfig

# Final-norm gain is set so the logits have about this standard deviation: peaked enough to be
# a distribution with structure, flat enough that a random model emits varied tokens.
TARGET_LOGIT_STD = 2.0
INIT_STD = 0.02


def rope_tables(config: DecoderConfig) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin of shape [max_position, head_dim // 2] (the HF rotate-half convention), frequencies scaled by
    `config.rope_scale` where it is set."""
    half = config.head_dim // 2
    inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, half, dtype=np.float64) * 2 / config.head_dim))
    if config.rope_scale is not None:
        inv_freq = llama3_inv_freq(inv_freq, config.rope_scale)
    freqs = np.outer(np.arange(config.max_position, dtype=np.float64), inv_freq)
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)


def llama3_inv_freq(inv_freq: np.ndarray, scale: Mapping[str, Any]) -> np.ndarray:
    """Llama 3.1's RoPE scaling (HF `rope_type: llama3`): wavelengths longer than original context /
    low_freq_factor are stretched by `factor`, shorter than original context / high_freq_factor kept, and those
    between interpolated smoothly (transformers' _compute_llama3_parameters, no attention factor)."""
    factor = float(scale["factor"])
    low, high = float(scale["low_freq_factor"]), float(scale["high_freq_factor"])
    context = float(scale["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > context / low, inv_freq / factor, inv_freq)
    smooth = (context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= context / high) & (wavelen <= context / low)
    return np.where(medium, smoothed, scaled)


def random_weights(config: DecoderConfig, seed: int) -> dict[str, np.ndarray]:
    """Seeded weights, generated in a fixed order so the same seed gives the same bytes."""
    rng = np.random.default_rng(seed)
    h, d, inter = config.hidden_size, config.head_dim, config.intermediate_size

    def normal(*shape: int, std: float = INIT_STD) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    def gain(n: int) -> np.ndarray:
        return (1.0 + normal(n, std=0.05)).astype(np.float32)

    out_std = INIT_STD / np.sqrt(2 * config.num_layers)
    w: dict[str, np.ndarray] = {"model.embed_tokens.weight": normal(config.vocab_size, h)}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = gain(h)
        w[p + "self_attn.q_proj.weight"] = normal(config.num_heads * d, h)
        w[p + "self_attn.k_proj.weight"] = normal(config.num_kv_heads * d, h)
        w[p + "self_attn.v_proj.weight"] = normal(config.num_kv_heads * d, h)
        w[p + "self_attn.o_proj.weight"] = normal(h, config.num_heads * d, std=out_std)
        w[p + "post_attention_layernorm.weight"] = gain(h)
        w[p + "mlp.gate_proj.weight"] = normal(inter, h)
        w[p + "mlp.up_proj.weight"] = normal(inter, h)
        w[p + "mlp.down_proj.weight"] = normal(h, inter, std=out_std)
    if not config.tie_embeddings:
        w["lm_head.weight"] = normal(config.vocab_size, h)
    final_gain = TARGET_LOGIT_STD / (INIT_STD * np.sqrt(h))
    w["model.norm.weight"] = (gain(h) * np.float32(final_gain)).astype(np.float32)
    return w


def reference_forward(config: DecoderConfig, w: Mapping[str, np.ndarray], input_ids: np.ndarray) -> np.ndarray:
    """Plain float64 numpy forward of one sequence from position 0 (no cache): logits [seq, vocab].

    The spec the ONNX graphs are tested against: optional q/k/v biases (Qwen2), per-head q/k RMSNorm before RoPE
    (Qwen3), RoPE scaling and a sliding window as the config says."""
    cos_t, sin_t = rope_tables(config)
    n = len(input_ids)
    x = w["model.embed_tokens.weight"][input_ids].astype(np.float64)
    cos, sin = cos_t[:n].astype(np.float64), sin_t[:n].astype(np.float64)
    d, g = config.head_dim, config.group_size

    def rms(v: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return np.asarray(v / np.sqrt((v * v).mean(-1, keepdims=True) + config.rms_norm_eps) * weight)

    def rope(t: np.ndarray) -> np.ndarray:  # [heads, n, d]
        a, b = t[..., : d // 2], t[..., d // 2 :]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)

    def project(hdn: np.ndarray, p: str, m: str, heads: int) -> np.ndarray:  # -> [heads, n, d]
        y = hdn @ w[p + f"self_attn.{m}_proj.weight"].T
        if p + f"self_attn.{m}_proj.bias" in w:
            y = y + w[p + f"self_attn.{m}_proj.bias"]
        y = y.reshape(n, heads, d)
        if p + f"self_attn.{m}_norm.weight" in w:  # Qwen3: RMSNorm over each head's vector
            y = rms(y, w[p + f"self_attn.{m}_norm.weight"])
        return np.asarray(y.transpose(1, 0, 2))

    rows, cols = np.indices((n, n))
    hidden = cols > rows
    if config.attention_window:
        hidden |= rows - cols >= config.attention_window
    causal = np.where(hidden, -np.inf, 0.0)
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        hdn = rms(x, w[p + "input_layernorm.weight"])
        q = project(hdn, p, "q", config.num_heads)
        k = project(hdn, p, "k", config.num_kv_heads)
        v = project(hdn, p, "v", config.num_kv_heads)
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, g, axis=0), np.repeat(v, g, axis=0)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(d) + causal
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        ctx = (s @ v).transpose(1, 0, 2).reshape(n, config.num_heads * d)
        x = x + ctx @ w[p + "self_attn.o_proj.weight"].T
        hdn = rms(x, w[p + "post_attention_layernorm.weight"])
        gate = hdn @ w[p + "mlp.gate_proj.weight"].T
        up = hdn @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms(x, w["model.norm.weight"])
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return np.asarray(x @ head.T, dtype=np.float32)
