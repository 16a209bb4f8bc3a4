"""The decoder shapes `model build-random` knows (Llama/Qwen-style and gpt-oss), on the Harmony vocabulary or
their own."""

from __future__ import annotations

import dataclasses

from service.engine.config import HARMONY_BOS_ID, HARMONY_EOS_ID, HARMONY_VOCAB_SIZE, DecoderConfig
from service.engine.gptoss import FULL, SLIDING, GptOssSpec

# Known architectures, with the vocabulary size of the original model ("native"); build-random puts
# them on the Harmony vocabulary by default so that what it writes can be served as it is.
SHAPES: dict[str, DecoderConfig] = {
    "qwen2.5-0.5b": DecoderConfig(
        vocab_size=151_936,
        hidden_size=896,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        head_dim=64,
        intermediate_size=4864,
        max_position=4096,
        rope_theta=1_000_000.0,
        tie_embeddings=True,
    ),
    "tiny": DecoderConfig(
        vocab_size=4096,
        hidden_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        intermediate_size=384,
        max_position=2048,
    ),
}

_GPTOSS_YARN = {
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "original_max_position_embeddings": 4096,
    "truncate": False,
}


def alternating_layers(layers: int) -> tuple[str, ...]:
    return tuple(SLIDING if i % 2 == 0 else FULL for i in range(layers))


# gpt-oss shapes: the decoder (intermediate_size = one expert's) and the MoE/attention extras.
# Harmony's vocabulary and special tokens, so the service's Harmony renderer drives them.
GPTOSS_SHAPES: dict[str, tuple[DecoderConfig, GptOssSpec]] = {
    "gpt-oss-20b": (
        DecoderConfig(
            vocab_size=201_088,
            hidden_size=2880,
            num_layers=24,
            num_heads=64,
            num_kv_heads=8,
            head_dim=64,
            intermediate_size=2880,
            max_position=4096,
            rope_theta=150_000.0,
            rms_norm_eps=1e-5,
            tie_embeddings=False,
            bos_token_id=199998,
            eos_token_id=200002,
        ),
        GptOssSpec(32, 4, 128, alternating_layers(24), yarn=_GPTOSS_YARN, expert_bits=4),
    ),
    "gpt-oss-tiny": (
        DecoderConfig(
            vocab_size=201_088,
            hidden_size=64,
            num_layers=4,
            num_heads=4,
            num_kv_heads=2,
            head_dim=32,
            intermediate_size=64,
            max_position=1024,
            rope_theta=150_000.0,
            rms_norm_eps=1e-5,
            tie_embeddings=False,
            bos_token_id=199998,
            eos_token_id=200002,
        ),
        GptOssSpec(8, 2, 16, alternating_layers(4), yarn=_GPTOSS_YARN, expert_bits=4),
    ),
}


def shape_config(shape: str, vocab: str = "harmony") -> DecoderConfig:
    """A shape on the Harmony vocabulary ("harmony"), or with its original vocabulary size ("native")."""
    config = SHAPES[shape]
    if vocab == "native":
        return config
    if vocab != "harmony":
        raise ValueError(f"unknown vocabulary {vocab!r}")
    return dataclasses.replace(
        config, vocab_size=HARMONY_VOCAB_SIZE, bos_token_id=HARMONY_BOS_ID, eos_token_id=HARMONY_EOS_ID
    )
