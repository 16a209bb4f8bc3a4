"""A JSON-able description of a model directory: format, quantization, ops, CPU and kernel path."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from service.engine.config import read_config
from service.engine.cpu import CpuFeatures, cpu_features
from service.engine.info_moe import describe_moe, logical_parameters
from service.engine.model_dir import is_checkpoint_dir
from service.engine.model_files import ModelDirError, find_model_file

_REPORTED_OPS = (
    "MatMulInteger",
    "DynamicQuantizeMatMul",
    "DynamicQuantizeLinear",
    "MatMulNBits",
    "MatMulIntegerToFloat",
    "MatMul",
    "GroupQueryAttention",
    "RotaryEmbedding",
    "SkipSimplifiedLayerNormalization",
    "SimplifiedLayerNormalization",
    "Attention",
    "MultiHeadAttention",
    "Gather",
    "Softmax",
    "MoE",
    "QMoE",
)


def model_info(model_dir: Path) -> dict[str, Any]:
    model_dir = Path(model_dir)
    if is_checkpoint_dir(model_dir):
        raise ModelDirError(
            f"{model_dir} is a Hugging Face checkpoint, not a model directory: `python -m service model import` it "
            "(or serve it with SERVICE_MODEL, which imports it into the model cache)"
        )
    path = find_model_file(model_dir)
    meta = read_config(model_dir)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends: the file is not a graph
        raise ModelDirError(f"{path} is not an ONNX graph: {' '.join(str(exc).split())}") from exc
    ops = Counter(n.op_type for n in model.graph.node)
    stored = sum(f.stat().st_size for f in model_dir.iterdir() if f.is_file())
    weights = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    cpu = cpu_features()
    moe, attention = describe_moe(model)
    # genai_config.json does not give the MLP width: no count then
    parameters: int | None = meta.decoder.parameter_count() if meta.decoder.intermediate_size else None
    extra: dict[str, Any] = {}
    if moe is not None:  # MoE: the Llama formula does not apply; count the graph's weights
        total, idle = logical_parameters(model)
        parameters = total
        extra = {"mixture_of_experts": moe, "active_parameters": total - idle}
    source = meta.extra.get("source")
    if isinstance(source, dict):  # imported from a checkpoint (`model import`): what it was, counted there
        parameters = source.get("parameters", parameters)
        extra["source"] = source
    return {
        "path": str(model_dir),
        "model_file": path.name,
        "format": meta.extra.get("format", "onnx"),
        "graph": meta.extra.get("graph", "unknown"),
        "model_id": meta.model_id or model_dir.name,
        "chat_format": meta.extra.get("chat_format"),
        "quantization": meta.extra.get("quantization"),
        "decoding": decoding(meta.extra, moe, cpu),
        "decoder": meta.decoder.to_dict(),
        "parameters": parameters,
        **extra,
        "attention": attention,
        "stored_weight_elements": weights,
        "size_bytes": stored,
        "op_counts": {op: ops[op] for op in _REPORTED_OPS if ops[op]},
        "opsets": {o.domain or "ai.onnx": o.version for o in model.opset_import},
        "cpu": cpu.to_dict(),
        "int8_kernel": cpu.int8_kernel,
        "onnxruntime": ort.__version__,
    }


def decoding(
    extra: dict[str, Any], moe: dict[str, Any] | None = None, cpu: CpuFeatures | None = None
) -> dict[str, Any]:
    """How the engine steps this model's sequences: batched on a shared-buffer KV cache (bit-identical to
    decoding alone with MatMulNBits int8 at accuracy level 4 or per-row int8), else one at a time."""
    if moe and moe.get("expert_bits") == 4 and cpu is not None and not cpu.int4_experts_batch_invariant:
        return {
            "batched": False,
            "note": "one sequence per run: on this CPU (no VNNI) 4-bit experts round a row differently in a "
            "batch than alone, and a resume must reproduce the run bit for bit",
        }
    if extra.get("kv_cache") != "shared_buffer":
        return {
            "batched": False,
            "note": "one sequence per run (Concat KV cache); `model quantize SRC DST --layout contrib` on the "
            "fp32 model writes a graph that batches",
        }
    scheme = extra.get("quantization") or {}
    kind = scheme.get("scheme")
    if kind == "matmulnbits_int4" and cpu is not None and not cpu.int4_experts_batch_invariant:
        return {
            "batched": False,
            "note": "one sequence per run: int4 MatMulNBits was measured batch-invariant on VNNI CPUs only (this one "
            "has none), and a resume must reproduce the run bit for bit",
        }
    # Rows never meet in a sum: MatMulNBits at accuracy level 4 quantizes per row block; rows_int8 per row,
    # with exact int32 sums; int4 MatMulNBits likewise in blocks of 16 and 32 (graph_contrib.INT4_BLOCK_SIZES).
    invariant = kind == "rows_int8" or (
        kind in ("matmulnbits_int8", "matmulnbits_int4") and scheme.get("accuracy_level") == 4
    )
    return {
        "batched": True,
        "batch_invariant": invariant,
        "note": "all decoding sequences in one run per token"
        + ("; each row's logits bit-identical to decoding it alone" if invariant else ""),
    }
