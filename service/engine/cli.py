"""`model ...` subcommands for the service CLI."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from service.engine.builder import build_random_decoder
from service.engine.config import DecoderConfig
from service.engine.gptoss import FULL, SLIDING, GptOssSpec, random_gptoss_weights
from service.engine.graph_gptoss import write_gptoss_model
from service.engine.info import model_info
from service.engine.model_dir import ensure_builtin_model
from service.engine.quantize import quantize_model

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


def _alternating(layers: int) -> tuple[str, ...]:
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
        GptOssSpec(32, 4, 128, _alternating(24), yarn=_GPTOSS_YARN, expert_bits=4),
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
        GptOssSpec(8, 2, 16, _alternating(4), yarn=_GPTOSS_YARN, expert_bits=4),
    ),
}


def add_model_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add `model {build-default,quantize,info,build-random}` to a parent parser's subparsers."""
    model = subparsers.add_parser("model", help="build, quantize and inspect models")
    sub = model.add_subparsers(dest="model_command", required=True)

    p = sub.add_parser("build-default", help="build (if needed) and cache the built-in model")
    p.add_argument("--cache-dir", type=Path, default=None)
    p.set_defaults(func=_build_default)

    p = sub.add_parser("quantize", help="int8-quantize a model directory")
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    p.set_defaults(func=_quantize)

    p = sub.add_parser("info", help="print a model directory's description as JSON")
    p.add_argument("path", type=Path, nargs="?", default=None, help="default: the built-in model")
    p.set_defaults(func=_info)

    p = sub.add_parser("build-random", help="build a random-weight model of a known shape")
    p.add_argument("out", type=Path)
    p.add_argument("--shape", choices=sorted([*SHAPES, *GPTOSS_SHAPES]), default="tiny")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fp32", action="store_true", help="skip int8 quantization (not for gpt-oss shapes)")
    p.add_argument("--layers", type=int, default=None, help="gpt-oss shapes: fewer layers of the same width")
    p.add_argument("--expert-bits", type=int, choices=[4, 8], default=None, help="gpt-oss shapes (default 4)")
    p.set_defaults(func=_build_random)


def run_model_command(args: argparse.Namespace) -> int:
    return int(args.func(args) or 0)


def _build_default(args: argparse.Namespace) -> int:
    print(ensure_builtin_model(args.cache_dir, progress=True))
    return 0


def _quantize(args: argparse.Namespace) -> int:
    print(quantize_model(args.src, args.dst))
    return 0


def _info(args: argparse.Namespace) -> int:
    path = args.path or ensure_builtin_model(progress=True)
    print(json.dumps(model_info(path), indent=2))
    return 0


def _build_random(args: argparse.Namespace) -> int:
    started = time.monotonic()
    if args.shape in GPTOSS_SHAPES:
        out = _build_random_gptoss(args)
        print(f"{out} ({time.monotonic() - started:.1f}s)")
        return 0
    out = build_random_decoder(
        args.out,
        SHAPES[args.shape],
        args.seed,
        quantize=not args.fp32,
        extra={"model_id": f"random-{args.shape}"},
        progress=print,
    )
    print(f"{out} ({time.monotonic() - started:.1f}s)")
    return 0


def _build_random_gptoss(args: argparse.Namespace) -> Path:
    """Random weights, experts drawn directly as int4/int8 codes (a real-shape model never exists in fp32)."""
    config, spec = GPTOSS_SHAPES[args.shape]
    layers = args.layers or config.num_layers
    config = DecoderConfig(**{**config.to_dict(), "num_layers": layers})
    spec = GptOssSpec(**{**spec.__dict__, "layer_types": _alternating(layers), "expert_bits": args.expert_bits or 4})
    print("weights + graph")
    weights = random_gptoss_weights(config, spec, args.seed, expert_codes=True)
    extra = {"model_id": f"random-{args.shape}", "chat_format": "harmony", "seed": args.seed}
    return write_gptoss_model(args.out, config, spec, weights, quantize_dense=True, extra=extra)
