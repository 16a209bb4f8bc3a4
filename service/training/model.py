"""The decoder in torch: the architecture the engine serves (service/engine/weights.reference_forward),
with the same parameter names and layouts (Hugging Face Llama: [out, in]), over a compact vocabulary.

RMSNorm, rotary embeddings (rotate-half), grouped-query attention (over a sliding window where the config sets
one), SwiGLU MLP, untied head (or, in training only, a head tied to the embedding).
Only the training command imports this module (torch is a build-time extra)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from service.engine.config import DecoderConfig


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, allowed: torch.Tensor | None
    ) -> torch.Tensor:
        b, n, _ = x.shape
        c = self.c
        q = self.q_proj(x).view(b, n, c.num_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, c.num_kv_heads, c.head_dim).transpose(1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        k = k.repeat_interleave(c.group_size, dim=1)  # query head j reads kv head j // group_size
        v = v.repeat_interleave(c.group_size, dim=1)
        if allowed is None:
            ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        return self.o_proj(ctx.transpose(1, 2).reshape(b, n, c.num_heads * c.head_dim))


def _rope(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = t.shape[-1] // 2
    a, b = t[..., :half], t[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


class MLP(nn.Module):
    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, allowed: torch.Tensor | None
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, allowed)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class Decoder(nn.Module):
    """`config.vocab_size` is the compact vocabulary; state_dict() keys are the engine's weight names."""

    def __init__(self, config: DecoderConfig, max_len: int = 1024, tie_embeddings: bool = False) -> None:
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if tie_embeddings:  # trained as one table; state_dict() still has both names (the export copies it)
            self.lm_head.weight = self.model.embed_tokens.weight
        half = config.head_dim // 2
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, half, dtype=torch.float64) * 2 / config.head_dim))
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float64), inv_freq)
        self.register_buffer("cos", freqs.cos().float(), persistent=False)
        self.register_buffer("sin", freqs.sin().float(), persistent=False)
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * config.num_layers))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [b, n] -> logits [b, n, vocab]."""
        return self.lm_head(self.hidden(ids))

    def logits_at(self, ids: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
        """ids [b, n], where [b, n] bool -> logits [k, vocab] at the k positions where is true: training
        and its checks need them only where a label is, and the head is this small model's largest matmul."""
        return self.lm_head(self.hidden(ids)[where])

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [b, n] -> the final norm's output [b, n, hidden]."""
        n = ids.shape[1]
        cos, sin = self.cos[:n], self.sin[:n]
        allowed = window_mask(n, self.config.attention_window)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, allowed)
        return self.model.norm(x)


def window_mask(n: int, window: int) -> torch.Tensor | None:
    """[n, n] bool, True where query i may attend key j: j <= i and i - j < window (the engine's
    attention_window, itself included); None where that is plain causal attention (no window, or n <= window)."""
    if window <= 0 or n <= window:
        return None
    distance = torch.arange(n).view(n, 1) - torch.arange(n).view(1, n)
    return (distance >= 0) & (distance < window)
