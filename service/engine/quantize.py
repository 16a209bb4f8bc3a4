"""int8 quantization of a decoder model directory with onnxruntime.quantization."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

import onnx
from onnxruntime.quantization import QuantType, quantize_dynamic

from service.engine.builder import MODEL_FILE, save_model
from service.engine.config import read_config, write_config
from service.engine.cpu import cpu_features


def find_model_file(model_dir: Path) -> Path:
    for name in (MODEL_FILE, "decoder_model_merged.onnx", "decoder_with_past_model.onnx", "model_quantized.onnx"):
        if (model_dir / name).exists():
            return model_dir / name
    found = sorted(model_dir.glob("*.onnx"))
    if not found:
        raise FileNotFoundError(f"no .onnx model in {model_dir}")
    return found[0]


def quantize_model(src_dir: Path, dst_dir: Path, *, reduce_range: bool | None = None) -> Path:
    """Dynamic int8 (per-channel weights, u8 activations) of every MatMul by a constant weight.

    reduce_range (7-bit weights) defaults to on for CPUs without VNNI, whose u8s8 kernel saturates."""
    cpu = cpu_features()
    rr = cpu.needs_reduce_range if reduce_range is None else reduce_range
    src = find_model_file(src_dir)
    dst_dir.mkdir(parents=True, exist_ok=True)
    large = sum(f.stat().st_size for f in src_dir.iterdir() if f.is_file()) > (1 << 30)
    logging.getLogger().setLevel(logging.WARNING)  # the quantizer is chatty at INFO
    with tempfile.TemporaryDirectory(dir=dst_dir) as tmp:
        out = Path(tmp) / MODEL_FILE
        quantize_dynamic(
            src,
            out,
            op_types_to_quantize=["MatMul"],
            per_channel=True,
            reduce_range=rr,
            weight_type=QuantType.QInt8,
            use_external_data_format=large,
            extra_options={"MatMulConstBOnly": True},
        )
        # Re-save through our writer: one deterministic layout, external data only when large.
        save_model(onnx.load(str(out)), dst_dir / MODEL_FILE)
    meta = read_config(src_dir)
    scheme: dict[str, Any] = {
        "scheme": "dynamic_int8",
        "tool": "onnxruntime.quantization.quantize_dynamic",
        "weight_type": "int8",
        "activation_type": "uint8 (dynamic, per tensor)",
        "per_channel": True,
        "reduce_range": rr,
        "op_types": ["MatMul"],
        "built_for_kernel": cpu.int8_kernel,
    }
    meta.extra["quantization"] = scheme
    write_config(dst_dir, meta)
    return dst_dir
