"""The model cache: the built-in model (trained here, shipped in the package), the random test model, and
Hugging Face checkpoints imported for SERVICE_MODEL.

The built-in model ships as a compact artifact in `service/builtin_model/` (float16 weights over
the few thousand ids its corpus uses, plus a manifest with its SHA-256, training configuration
and metrics). On first use it is checked against that hash and expanded into a servable ONNX int8
directory in the cache: seconds, never training. The random-weight model (endless generation,
for tests and benchmarks) is built from a seed the same way it always was. A checkpoint directory
(config.json + *.safetensors, no graph) is imported once into a directory named by its content hash;
later starts find it there."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from service.engine.compact import EMBED_INDEX, HEAD_IDS, ArtifactError, graph_weights, load_compact
from service.engine.config import DecoderConfig, default_int8_block, int8_layout_label

HARMONY_VOCAB_SIZE = 201_088  # the Harmony (o200k_harmony) vocabulary
BUILTIN_NAME = "builtin-harmony-tiny"
# Bump when the builder, weights or quantization change: the cache directory name carries it.
BUILTIN_VERSION = 5
BUILTIN_ARTIFACT_DIR = Path(__file__).resolve().parents[1] / "builtin_model"
BUILTIN_MANIFEST = BUILTIN_ARTIFACT_DIR / f"{BUILTIN_NAME}.json"

log = logging.getLogger(__name__)

RANDOM_NAME = "random-harmony-tiny"
RANDOM_VERSION = 4
RANDOM_SEED = 20250801
# The ids the random model writes: the first RANDOM_WRITABLE (o200k's most frequent merges, no special
# token), so that a step computes 8,192 logits, not 201,088; its embedding has as many rows, id i reading
# row i % RANDOM_WRITABLE. Special tokens come only where a constraint or the Harmony header allows nothing
# else (they all tie at UNSEEN_LOGIT there), so the model never ends a run by itself.
RANDOM_WRITABLE = 8192
RANDOM_CONFIG = DecoderConfig(
    vocab_size=HARMONY_VOCAB_SIZE,
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


def read_manifest(path: Path = BUILTIN_MANIFEST) -> dict[str, Any]:
    if not path.is_file():
        raise ArtifactError(f"built-in model manifest {path} is missing (a broken install?)")
    manifest: dict[str, Any] = json.loads(path.read_text())
    return manifest


def builtin_dir_name(manifest: dict[str, Any] | None = None) -> str:
    sha = (manifest or read_manifest())["sha256"]
    return f"{BUILTIN_NAME}-v{BUILTIN_VERSION}-{sha[:12]}-int8"


def random_dir_name() -> str:
    return f"{RANDOM_NAME}-v{RANDOM_VERSION}-int8"


def materialise_builtin(manifest_path: Path, out_dir: Path) -> Path:
    """Check the artifact beside `manifest_path` against its hash, turn it into graph weights (compact tables),
    write the contrib-op int8 graph + config.json to `out_dir`."""
    manifest = read_manifest(manifest_path)
    compact = load_compact(manifest_path.parent / manifest["artifact"], manifest["sha256"])
    config = replace(DecoderConfig.from_dict(manifest["decoder"]), vocab_size=HARMONY_VOCAB_SIZE)
    extra = {
        "model_id": manifest["model_id"],
        "chat_format": "harmony",
        "builtin_version": BUILTIN_VERSION,
        "artifact_sha256": manifest["sha256"],
        "description": "small Harmony decoder trained offline on a synthetic corpus (see the README's model card)",
    }
    from service.engine.builder import write_contrib_model  # imports onnx: only when a model is built

    return write_contrib_model(out_dir, config, graph_weights(compact, config), quantize=True, extra=extra)


def _cached(target: Path, name: str, build: Callable[[Path], Path], progress: bool) -> Path:
    """`target`, built first if needed: in a temporary sibling renamed into place, so a crash mid-build
    never leaves a half model; concurrent builders race harmlessly (the loser discards its copy)."""
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=1, desc=f"building {name}", disable=not progress, unit="step")
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        out = build(tmp / "model")
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


def ensure_builtin_model(cache_dir: Path | None = None, progress: bool = True) -> Path:
    """The built-in (trained) model's servable directory, materialised from the shipped artifact if needed."""
    manifest = read_manifest()
    target = (cache_dir or default_model_dir()) / builtin_dir_name(manifest)
    return _cached(target, BUILTIN_NAME, lambda out: materialise_builtin(BUILTIN_MANIFEST, out), progress)


def ensure_random_model(cache_dir: Path | None = None, progress: bool = True) -> Path:
    """The seeded random-weight Harmony model (never stops by itself: for tests and benchmarks)."""
    target = (cache_dir or default_model_dir()) / random_dir_name()
    extra = {
        "model_id": RANDOM_NAME,
        "chat_format": "harmony",
        "description": "random-weight Llama-style decoder on the Harmony vocabulary (for tests and benchmarks)",
    }

    def build(out: Path) -> Path:
        from service.engine.builder import write_contrib_model  # imports onnx: only when a model is built
        from service.engine.weights import random_weights

        weights = random_weights(replace(RANDOM_CONFIG, vocab_size=RANDOM_WRITABLE), RANDOM_SEED)
        weights[EMBED_INDEX] = np.arange(RANDOM_CONFIG.vocab_size) % RANDOM_WRITABLE
        weights[HEAD_IDS] = np.arange(RANDOM_WRITABLE)
        return write_contrib_model(out, RANDOM_CONFIG, weights, quantize=True, extra={"seed": RANDOM_SEED, **extra})

    return _cached(target, RANDOM_NAME, build, progress)


def describe_builtin() -> dict[str, Any]:
    """What the built-in model is: its id, artifact, hash, shape and recorded metrics."""
    manifest = read_manifest()
    return {
        "model_id": manifest["model_id"],
        "artifact": str(BUILTIN_ARTIFACT_DIR / manifest["artifact"]),
        "sha256": manifest["sha256"],
        "artifact_bytes": manifest["size_bytes"],
        "decoder": manifest["decoder"],
        "metrics": manifest["metrics"],
    }


# Bump when the importers' output changes for the same checkpoint: the cache directory name carries it.
IMPORT_VERSION = 1
# SHA-256s of checkpoint files already hashed, by path, size, mtime and inode (importers/checkpoint.py).
HASH_MEMO = ".checkpoint-hashes.json"


def is_checkpoint_dir(path: Path) -> bool:
    """A directory holding config.json and safetensors weights but no ONNX graph: a Hugging Face checkpoint,
    which `model import` (and SERVICE_MODEL, through ensure_imported_model) reads."""
    path = Path(path)
    if not (path / "config.json").is_file() or any(path.glob("*.onnx")):
        return False
    return any(path.glob("*.safetensors"))


def ensure_imported_model(src: Path, cache_dir: Path | None = None, progress: bool = True) -> Path:
    """The model directory imported from the Hugging Face checkpoint `src`, imported into the cache first if no
    import of the same content (config.json and every safetensors file's SHA-256) is there; logs which."""
    from service.engine.importers import (  # reads safetensors: only for a checkpoint
        Checkpoint,
        checkpoint_model_id,
        default_bits,
        import_checkpoint,
    )

    cache = cache_dir or default_model_dir()
    memo = cache / HASH_MEMO
    with Checkpoint(src) as ckpt:
        digest = ckpt.content_hash(memo)
        bits = default_bits(ckpt.model_type)
        name = checkpoint_model_id(src)  # org/name for a Hugging Face cache snapshot
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "checkpoint"
    # The int8 layout is chosen for this CPU (per row, u8s8 or u8u8): a cache carried to another CPU imports anew.
    layout = f"-{int8_layout_label(default_int8_block())}" if bits == 8 else ""
    target = cache / f"imported-{slug}-{digest[:16]}-v{IMPORT_VERSION}-int{bits}{layout}"
    if (target / "config.json").exists():
        log.info("SERVICE_MODEL=%s: serving %s, imported before (checkpoint sha256 %s)", src, target, digest[:16])
        return target
    started = time.monotonic()

    def build(out: Path) -> Path:
        return import_checkpoint(src, out, bits=bits, bar=progress, hash_memo=memo)

    _cached(target, f"imported-{slug}", build, progress=False)
    log.info(
        "SERVICE_MODEL=%s: imported into %s in %.1fs (checkpoint sha256 %s)",
        src,
        target,
        time.monotonic() - started,
        digest[:16],
    )
    return target
