"""The model cache and the built-in model, built on first use."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from service.engine.builder import build_random_decoder
from service.engine.config import DecoderConfig

BUILTIN_NAME = "builtin-harmony-tiny"
# Bump when the builder, weights or quantization change: the cache directory name carries it.
BUILTIN_VERSION = 2
BUILTIN_SEED = 20250801
BUILTIN_CONFIG = DecoderConfig(
    vocab_size=201_088,  # the Harmony (o200k_harmony) vocabulary
    hidden_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    intermediate_size=384,
    max_position=4096,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    # Untied: with a tied random head the current token's own embedding dominates the logits and the
    # model repeats it; an independent head costs nothing extra (the tied table is kept fp32 for Gather).
    tie_embeddings=False,
    bos_token_id=199998,  # <|startoftext|>
    eos_token_id=200002,  # <|return|>
)


def default_model_dir() -> Path:
    """The model cache: $SERVICE_MODEL_CACHE, else ~/.cache/responses-service/models."""
    env = os.environ.get("SERVICE_MODEL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "responses-service" / "models"


def builtin_dir_name() -> str:
    return f"{BUILTIN_NAME}-v{BUILTIN_VERSION}-int8"


def ensure_builtin_model(cache_dir: Path | None = None, progress: bool = True) -> Path:
    """The built-in model's directory, building and caching it first if needed.

    Built in a temporary sibling directory and renamed into place, so a crash mid-build never
    leaves a half model; concurrent builders race harmlessly (the loser discards its copy)."""
    cache = cache_dir or default_model_dir()
    target = cache / builtin_dir_name()
    if (target / "config.json").exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    steps = ["weights + graph"]
    bar = tqdm(total=len(steps), desc=f"building {BUILTIN_NAME}", disable=not progress, unit="step")
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix=f".{BUILTIN_NAME}-", dir=cache))
    try:
        out = tmp / "model"
        extra = {
            "model_id": BUILTIN_NAME,
            "chat_format": "harmony",
            "builtin_version": BUILTIN_VERSION,
            "description": "random-weight Llama-style decoder on the Harmony vocabulary (for tests and demos)",
        }

        def note(msg: str) -> None:
            bar.set_postfix_str(msg)
            if msg != steps[0]:
                bar.update(1)

        build_random_decoder(out, BUILTIN_CONFIG, BUILTIN_SEED, quantize=True, extra=extra, progress=note)
        bar.update(1)
        try:
            out.rename(target)
        except OSError:
            if not (target / "config.json").exists():
                raise
    finally:
        bar.close()
        shutil.rmtree(tmp, ignore_errors=True)
    if progress:
        print(f"built {target} in {time.monotonic() - started:.1f}s")
    return target
