"""Deterministic random weights for a Llama-style decoder, in Hugging Face names and layout ([out, in])."""

from __future__ import annotations

import numpy as np

from service.engine.config import DecoderConfig

# Final-norm gain is set so the logits have about this standard deviation: peaked enough to be
# a distribution with structure, flat enough that a random model emits varied tokens.
TARGET_LOGIT_STD = 2.0
INIT_STD = 0.02


def rope_tables(config: DecoderConfig) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin of shape [max_position, head_dim // 2] (the HF rotate-half convention)."""
    half = config.head_dim // 2
    inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, half, dtype=np.float64) * 2 / config.head_dim))
    freqs = np.outer(np.arange(config.max_position, dtype=np.float64), inv_freq)
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)


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


def reference_forward(config: DecoderConfig, w: dict[str, np.ndarray], input_ids: np.ndarray) -> np.ndarray:
    """Plain float64 numpy forward of one sequence from position 0 (no cache): logits [seq, vocab].

    The spec the ONNX graphs are tested against."""
    cos_t, sin_t = rope_tables(config)
    n = len(input_ids)
    x = w["model.embed_tokens.weight"][input_ids].astype(np.float64)
    cos, sin = cos_t[:n].astype(np.float64), sin_t[:n].astype(np.float64)
    d, g = config.head_dim, config.group_size

    def rms(v: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + config.rms_norm_eps) * weight

    def rope(t: np.ndarray) -> np.ndarray:  # [heads, n, d]
        a, b = t[..., : d // 2], t[..., d // 2 :]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)

    causal = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        hdn = rms(x, w[p + "input_layernorm.weight"])
        q = (hdn @ w[p + "self_attn.q_proj.weight"].T).reshape(n, config.num_heads, d).transpose(1, 0, 2)
        k = (hdn @ w[p + "self_attn.k_proj.weight"].T).reshape(n, config.num_kv_heads, d).transpose(1, 0, 2)
        v = (hdn @ w[p + "self_attn.v_proj.weight"].T).reshape(n, config.num_kv_heads, d).transpose(1, 0, 2)
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
    return (x @ head.T).astype(np.float32)
