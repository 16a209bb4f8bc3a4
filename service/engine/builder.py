"""Build a seeded random-weight Llama-style decoder as an ONNX model directory."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from service.engine.compact import HEAD_IDS, write_head_ids
from service.engine.config import INT8_BLOCK_SIZE, DecoderConfig, ModelMeta, write_config
from service.engine.graph_contrib import build_contrib_graph
from service.engine.graph_standard import build_standard_graph
from service.engine.model_files import MODEL_FILE, save_model
from service.engine.quantize import contrib_int8_scheme, quantize_model
from service.engine.weights import random_weights

Progress = Callable[[str], None]


def write_fp32_decoder(
    out_dir: Path, config: DecoderConfig, seed: int, *, extra: dict[str, Any] | None = None, all_logits: bool = False
) -> Path:
    """Weights + graph + config.json, unquantized."""
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = random_weights(config, seed)
    model = build_standard_graph(config, weights, all_logits=all_logits)
    del weights
    save_model(model, out_dir / MODEL_FILE)
    meta = {
        "format": "onnx-decoder-with-past",
        "graph": "standard",
        "seed": seed,
        "logits": "all" if all_logits else "last_position",
        "quantization": None,
        **(extra or {}),
    }
    write_config(out_dir, ModelMeta(config, meta))
    return out_dir


def write_contrib_decoder(
    out_dir: Path,
    config: DecoderConfig,
    seed: int,
    *,
    quantize: bool,
    extra: dict[str, Any] | None = None,
    block: int = INT8_BLOCK_SIZE,
) -> Path:
    """The contrib-op graph (GroupQueryAttention, MatMulNBits int8 weights quantized here in numpy)."""
    weights = random_weights(config, seed)
    extra = {"seed": seed, **(extra or {})}
    return write_contrib_model(out_dir, config, weights, quantize=quantize, extra=extra, block=block)


def write_contrib_model(
    out_dir: Path,
    config: DecoderConfig,
    weights: dict[str, np.ndarray],
    *,
    quantize: bool,
    extra: dict[str, Any] | None = None,
    block: int = INT8_BLOCK_SIZE,
) -> Path:
    """Given weights (HF names and layout) -> the contrib-op graph + config.json in `out_dir` (int8 in blocks
    of `block` along K when `quantize`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model = build_contrib_graph(config, weights, quantize=quantize, block=block)
    save_model(model, out_dir / MODEL_FILE)
    meta = {
        "format": "onnx-decoder-with-past",
        "graph": "contrib",
        "kv_cache": "shared_buffer",
        "logits": "last_position",
        "quantization": contrib_int8_scheme(block) if quantize else None,
        **(write_head_ids(out_dir, weights[HEAD_IDS]) if HEAD_IDS in weights else {}),
        **(extra or {}),
    }
    write_config(out_dir, ModelMeta(config, meta))
    return out_dir


def build_random_decoder(
    out_dir: Path,
    config: DecoderConfig,
    seed: int,
    *,
    quantize: bool = True,
    extra: dict[str, Any] | None = None,
    graph: str = "contrib",
    all_logits: bool = False,
    progress: Progress | None = None,
    block: int = INT8_BLOCK_SIZE,
) -> Path:
    """Write a deterministic random decoder (config.json + model.onnx) to `out_dir`; int8 when `quantize`.

    graph="contrib": ORT contrib ops, MatMulNBits int8 (the fast path). graph="standard": plain ONNX
    ops in the Optimum layout, int8 via quantize_dynamic. `extra` goes into config.json (model_id,
    chat_format, ...). `all_logits` (standard only) keeps logits for every position (tests). `block`
    (contrib only): the int8 weights' block size along K."""
    note = progress or (lambda _msg: None)
    if graph == "contrib":
        note("weights + graph")
        return write_contrib_decoder(out_dir, config, seed, quantize=quantize, extra=extra, block=block)
    if graph != "standard":
        raise ValueError(f"unknown graph kind {graph!r}")
    if block != INT8_BLOCK_SIZE:
        raise ValueError("an int8 block size is for contrib graphs (standard graphs get dynamic int8)")
    if not quantize:
        note("weights + graph")
        return write_fp32_decoder(out_dir, config, seed, extra=extra, all_logits=all_logits)
    with tempfile.TemporaryDirectory(prefix="fp32-", dir=out_dir.parent if out_dir.parent.exists() else None) as tmp:
        note("weights + graph")
        fp32 = write_fp32_decoder(Path(tmp), config, seed, extra=extra, all_logits=all_logits)
        note("int8 quantization")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        return quantize_model(fp32, out_dir)
