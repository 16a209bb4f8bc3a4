"""gpt-oss's shape beyond a Llama decoder: experts, top-k routing, sinks, sliding window, YaRN.

Stored in config.json under "gpt_oss" (see GptOssSpec.to_dict); the decoder part (vocab, hidden,
heads, head_dim, expert intermediate size, context) stays in DecoderConfig. Reads HF's GptOssConfig
(config.json with model_type "gpt_oss") too.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from service.engine.config import DecoderConfig

EXPERT_BLOCK = 32  # QMoE block size along K
SLIDING = "sliding_attention"
FULL = "full_attention"


@dataclass(frozen=True)
class GptOssSpec:
    num_experts: int
    top_k: int
    sliding_window: int
    layer_types: tuple[str, ...]
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    # YaRN (None: plain RoPE). Keys as in HF rope_parameters: factor, beta_fast, beta_slow,
    # original_max_position_embeddings, truncate.
    yarn: dict[str, Any] | None = field(default=None)
    expert_bits: int | None = None  # None: fp32 experts (MoE op); 4 or 8: QMoE

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["layer_types"] = list(self.layer_types)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GptOssSpec:
        return cls(
            num_experts=int(d["num_experts"]),
            top_k=int(d["top_k"]),
            sliding_window=int(d["sliding_window"]),
            layer_types=tuple(d["layer_types"]),
            swiglu_alpha=float(d.get("swiglu_alpha", 1.702)),
            swiglu_limit=float(d.get("swiglu_limit", 7.0)),
            yarn=d.get("yarn"),
            expert_bits=d.get("expert_bits"),
        )

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> GptOssSpec:
        """From an HF GptOssConfig dict (config.json of a checkpoint, or GptOssConfig.to_dict())."""
        layers = int(d["num_hidden_layers"])
        types = d.get("layer_types") or [SLIDING if i % 2 == 0 else FULL for i in range(layers)]
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        yarn = None
        if rope.get("rope_type", rope.get("type")) == "yarn":
            yarn = {
                "factor": float(rope["factor"]),
                "beta_fast": float(rope.get("beta_fast") or 32.0),
                "beta_slow": float(rope.get("beta_slow") or 1.0),
                "original_max_position_embeddings": int(rope["original_max_position_embeddings"]),
                "truncate": bool(rope.get("truncate", True)),
            }
            if rope.get("attention_factor") is not None:
                yarn["attention_factor"] = float(rope["attention_factor"])
        return cls(
            num_experts=int(d["num_local_experts"]),
            top_k=int(d["num_experts_per_tok"]),
            sliding_window=int(d.get("sliding_window") or 0),
            layer_types=tuple(types),
            swiglu_alpha=float(d.get("swiglu_alpha", 1.702)),
            swiglu_limit=float(d.get("swiglu_limit", 7.0)),
            yarn=yarn,
        )

    def active_parameters(self, c: DecoderConfig) -> int:
        """Weights read per decoded token: attention, router, top_k experts, norms, one embedding row, head."""
        h, d = c.hidden_size, c.head_dim
        attn = h * d * (c.num_heads * 2 + c.num_kv_heads * 2) + d * (c.num_heads + 2 * c.num_kv_heads) + h
        expert = 3 * h * c.intermediate_size + 2 * c.intermediate_size + h
        router = self.num_experts * (h + 1)
        per_layer = attn + router + self.top_k * expert + 2 * h + c.num_heads
        return c.num_layers * per_layer + h + c.vocab_size * h + h

    def total_parameters(self, c: DecoderConfig) -> int:
        h = c.hidden_size
        expert = 3 * h * c.intermediate_size + 2 * c.intermediate_size + h
        per_expert_layer = (self.num_experts - self.top_k) * expert
        return self.active_parameters(c) + c.num_layers * per_expert_layer + c.vocab_size * h


def yarn_inv_freq(head_dim: int, theta: float, yarn: dict[str, Any] | None) -> tuple[np.ndarray, float]:
    """Inverse frequencies and the attention (cos/sin) scale of YaRN (arXiv 2309.00071), as HF computes them."""
    exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    pos_freqs = np.float32(theta) ** exponents
    extrapolation = (1.0 / pos_freqs).astype(np.float32)
    if yarn is None:
        return extrapolation, 1.0
    factor = float(yarn["factor"])
    original = float(yarn["original_max_position_embeddings"])
    interpolation = (1.0 / (np.float32(factor) * pos_freqs)).astype(np.float32)
    scale = yarn.get("attention_factor")
    if scale is None:
        scale = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0

    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(float(yarn["beta_fast"])), correction_dim(float(yarn["beta_slow"]))
    if yarn.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float32) - low) / (high - low), 0, 1).astype(np.float32)
    keep = (1 - ramp).astype(np.float32)  # share of the unscaled (extrapolated) frequency
    inv_freq = interpolation * (1 - keep) + extrapolation * keep
    return inv_freq.astype(np.float32), float(scale)


def rope_caches(c: DecoderConfig, spec: GptOssSpec) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [max_position, head_dim // 2], YaRN's attention scale folded in (as HF applies it to both)."""
    inv_freq, scale = yarn_inv_freq(c.head_dim, c.rope_theta, spec.yarn)
    freqs = np.arange(c.max_position, dtype=np.float32)[:, None] * inv_freq[None, :]
    return (np.cos(freqs) * scale).astype(np.float32), (np.sin(freqs) * scale).astype(np.float32)


class LazyWeights(Mapping[str, np.ndarray]):
    """Weights made on access, each from its own seeded generator: a graph builder that writes each
    tensor out as it goes never holds a real-shape model in memory."""

    def __init__(self, makers: dict[str, Callable[[np.random.Generator], np.ndarray]], seed: int) -> None:
        self._makers = makers
        self._seed = seed

    def __getitem__(self, name: str) -> np.ndarray:
        return self._makers[name](np.random.default_rng([self._seed, zlib.crc32(name.encode())]))

    def __iter__(self) -> Iterator[str]:
        return iter(self._makers)

    def __len__(self) -> int:
        return len(self._makers)

    def __contains__(self, name: object) -> bool:
        return name in self._makers


def random_gptoss_weights(c: DecoderConfig, spec: GptOssSpec, seed: int, *, expert_codes: bool = False) -> LazyWeights:
    """Seeded random weights in HF's GptOss names and layouts (experts [E, H, 2I] interleaved gate/up).

    expert_codes: draw the experts directly as spec.expert_bits block codes and scales (QMoE layout,
    fc1/fc2 .codes/.scales), so a real-shape model never holds its experts in fp32."""
    h, d, i_size, e = c.hidden_size, c.head_dim, c.intermediate_size, spec.num_experts

    def normal(*shape: int, std: float = 0.02, mean: float = 0.0) -> Callable[[np.random.Generator], np.ndarray]:
        def make(rng: np.random.Generator) -> np.ndarray:
            return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std) + np.float32(mean)).astype(
                np.float32
            )

        return make

    def codes(shape: tuple[int, int, int], bits: int) -> Callable[[np.random.Generator], np.ndarray]:
        return lambda rng: _random_codes(rng, shape, bits)

    def full(shape: tuple[int, ...], value: float) -> Callable[[np.random.Generator], np.ndarray]:
        return lambda _rng: np.full(shape, value, dtype=np.float32)

    w = {
        "model.embed_tokens.weight": normal(c.vocab_size, h, std=1.0),
        "model.norm.weight": normal(h, std=0.1, mean=1.0),
        "lm_head.weight": normal(c.vocab_size, h, std=h**-0.5),
    }
    for layer in range(c.num_layers):
        p = f"model.layers.{layer}."
        w[p + "input_layernorm.weight"] = normal(h, std=0.1, mean=1.0)
        w[p + "post_attention_layernorm.weight"] = normal(h, std=0.1, mean=1.0)
        for m, rows in (("q", c.num_heads * d), ("k", c.num_kv_heads * d), ("v", c.num_kv_heads * d)):
            w[p + f"self_attn.{m}_proj.weight"] = normal(rows, h, std=h**-0.5)
            w[p + f"self_attn.{m}_proj.bias"] = normal(rows)
        w[p + "self_attn.o_proj.weight"] = normal(h, c.num_heads * d, std=(c.num_heads * d) ** -0.5)
        w[p + "self_attn.o_proj.bias"] = normal(h)
        w[p + "self_attn.sinks"] = normal(c.num_heads, std=1.0)
        w[p + "mlp.router.weight"] = normal(e, h, std=h**-0.5)
        w[p + "mlp.router.bias"] = normal(e)
        w[p + "mlp.experts.gate_up_proj_bias"] = normal(e, 2 * i_size)
        w[p + "mlp.experts.down_proj_bias"] = normal(e, h)
        if expert_codes and spec.expert_bits:
            for name, n, k in (("fc1", 2 * i_size, h), ("fc2", h, i_size)):
                w[p + f"mlp.experts.{name}.codes"] = codes((e, n, k), spec.expert_bits)
                qmax = (1 << (spec.expert_bits - 1)) - 1  # uniform codes: std ~ qmax / sqrt(3) steps
                w[p + f"mlp.experts.{name}.scales"] = full((e, n, k // EXPERT_BLOCK), k**-0.5 * np.sqrt(3) / qmax)
        else:
            w[p + "mlp.experts.gate_up_proj"] = normal(e, h, 2 * i_size, std=h**-0.5)
            w[p + "mlp.experts.down_proj"] = normal(e, i_size, h, std=i_size**-0.5)
    return LazyWeights(w, seed)


def _random_codes(rng: np.random.Generator, shape: tuple[int, int, int], bits: int) -> np.ndarray:
    """Uniform symmetric codes (never the unused -2^(bits-1)), packed as QMoE stores them."""
    e, n, k = shape
    levels = (1 << bits) - 1
    codes = (rng.integers(0, levels, size=(e, n, k), dtype=np.uint8) + 1).astype(np.uint8)
    if bits == 4:
        return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return codes
