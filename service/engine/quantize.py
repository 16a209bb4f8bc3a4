"""int8 quantization of a model directory into a new directory that can be served as it is.

Two schemes, picked by the graph: a contrib-op graph (GroupQueryAttention: ours, onnxruntime-genai's)
gets int8 MatMulNBits blocks (or per-row int8), exactly what `build-random` writes for int8; a standard-op graph
(Optimum exports) gets onnxruntime's dynamic int8 (MatMulInteger). Everything else in the source
directory (tokenizer, chat template, generation and genai configs) is copied. The result is written
to a hidden sibling directory and renamed into place at the end, so an interrupted run leaves no
half-written destination."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

import onnx
from onnx import helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

from service.engine.config import (
    CONFIG_FILE,
    INT8_BLOCK_SIZE,
    INT8_PER_ROW,
    int8_block_or_default,
    read_config,
    write_config,
)
from service.engine.cpu import cpu_features
from service.engine.graph_contrib import (
    MS,
    check_block_size,
    quantize_blockwise_int8,
    row_int8_kernel,
    row_int8_linear,
)
from service.engine.graph_util import GraphWriter
from service.engine.model_files import (
    MODEL_FILE,
    QUANTIZED_OPS,
    ModelDirError,
    copy_support_files,
    find_model_file,
    graph_files,
    new_directory,
    save_model,
)


class AlreadyQuantized(ModelDirError):
    """The source graph holds quantized weights already; quantizing it again would be wrong."""


def quantize_model(src_dir: Path, dst_dir: Path, *, reduce_range: bool | None = None, block: int | None = None) -> Path:
    """Write an int8 copy of the model in `src_dir` to the new directory `dst_dir`.

    reduce_range (7-bit weights, standard graphs only) defaults to on for CPUs without VNNI, whose
    u8s8 kernel saturates. `block` (contrib graphs only): the weights' block size along K or INT8_PER_ROW;
    default: default_int8_block(), chosen for this CPU."""
    src_dir, dst_dir = Path(src_dir), Path(dst_dir)
    src = find_model_file(src_dir)
    meta = read_config(src_dir)
    model = onnx.load(str(src), load_external_data=False)
    ops = {node.op_type for node in model.graph.node}
    if ops & QUANTIZED_OPS or meta.extra.get("quantization"):
        found = ", ".join(sorted(ops & QUANTIZED_OPS)) or f"config.json says {meta.extra.get('quantization')}"
        raise AlreadyQuantized(f"{src_dir} is quantized already ({found}); nothing to do")
    with new_directory(dst_dir) as tmp:
        if "GroupQueryAttention" in ops:
            block = int8_block_or_default(block)
            scheme = _quantize_contrib(onnx.load(str(src)), tmp / MODEL_FILE, block)
        elif block is not None:
            raise ModelDirError(
                f"{src_dir} is a standard-op graph: it gets dynamic int8 (no blocks); "
                "an int8 block size needs the contrib layout (--layout contrib)"
            )
        else:
            scheme = _quantize_dynamic(src, tmp / MODEL_FILE, reduce_range)
        copy_support_files(src_dir, tmp, skip=graph_files(src_dir) | {CONFIG_FILE})
        meta.extra["quantization"] = scheme
        write_config(tmp, meta)
    return dst_dir


def _quantize_contrib(model: onnx.ModelProto, out: Path, block: int) -> dict[str, Any]:
    """Every MatMul by a constant 2-D fp32 weight becomes int8, the scheme graph_contrib writes for `block`
    (MatMulNBits: 8 bits, symmetric blocks, accuracy level 4; or per row): the result equals a model built
    int8."""
    check_block_size(block)
    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    uses: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    nodes, dropped = [], set()
    rows = GraphWriter(prefix="int8/")  # the per-row scheme's nodes and constants
    for node in graph.node:
        b = weights.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if b is None or len(b.dims) != 2 or b.data_type != onnx.TensorProto.FLOAT:
            nodes.append(node)
            continue
        w = numpy_helper.to_array(b).T  # [K, N] -> [N, K]
        n, k = w.shape
        base = b.name.removesuffix(".weight_t")
        if block == INT8_PER_ROW:
            start = len(rows.nodes)
            row_int8_linear(rows, node.input[0], base, w, out=node.output[0])
            nodes.extend(rows.nodes[start:])
        else:
            qweight, scales = quantize_blockwise_int8(w, block)
            for suffix, array in (("qweight", qweight), ("scales", scales)):
                graph.initializer.append(numpy_helper.from_array(array, f"{base}.{suffix}"))
            ins = [node.input[0], f"{base}.qweight", f"{base}.scales"]
            attrs = {"K": k, "N": n, "bits": 8, "block_size": block, "accuracy_level": 4}
            nodes.append(helper.make_node("MatMulNBits", ins, list(node.output), name=node.name, domain=MS, **attrs))
        uses[b.name] -= 1
        if uses[b.name] == 0:
            dropped.add(b.name)
    del graph.node[:]
    graph.node.extend(nodes)
    kept = [t for t in [*graph.initializer, *rows.initializers] if t.name not in dropped]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    if not any(o.domain == MS for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS, 1))
    save_model(model, out)
    return contrib_int8_scheme(block)


def contrib_int8_scheme(block: int = INT8_BLOCK_SIZE) -> dict[str, Any]:
    """config.json's description of graph_contrib's int8 weights."""
    if block == INT8_PER_ROW:
        qgemm = row_int8_kernel()
        return {
            "scheme": "rows_int8",
            "op": "com.microsoft.MatMulIntegerToFloat",
            "bits": 8,
            "block_size": "row",
            "symmetric": True,
            "weight_type": "int8" if qgemm == "u8s8" else "uint8 (zero point 128)",
            "activation_type": "uint8 (zero point 128, dynamic, per row)",
            "qgemm": qgemm,
            "built_for_kernel": cpu_features().int8_kernel,
        }
    return {
        "scheme": "matmulnbits_int8",
        "op": "com.microsoft.MatMulNBits",
        "bits": 8,
        "block_size": block,
        "symmetric": True,
        "accuracy_level": 4,
        "activation_type": "int8 (dynamic, per row block)",
        "built_for_kernel": cpu_features().int8_kernel,
    }


def _quantize_dynamic(src: Path, out: Path, reduce_range: bool | None) -> dict[str, Any]:
    """Dynamic int8 (per-channel weights, u8 activations) of every MatMul by a constant weight."""
    cpu = cpu_features()
    rr = cpu.needs_reduce_range if reduce_range is None else reduce_range
    large = sum(f.stat().st_size for f in src.parent.iterdir() if f.is_file()) > (1 << 30)
    logging.getLogger().setLevel(logging.WARNING)  # the quantizer is chatty at INFO
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        raw = Path(tmp) / MODEL_FILE
        quantize_dynamic(
            src,
            raw,
            op_types_to_quantize=["MatMul"],
            per_channel=True,
            reduce_range=rr,
            weight_type=QuantType.QInt8,
            use_external_data_format=large,
            extra_options={"MatMulConstBOnly": True},
        )
        # Re-save through our writer: one deterministic layout, external data only when large.
        save_model(onnx.load(str(raw)), out)
    return {
        "scheme": "dynamic_int8",
        "tool": "onnxruntime.quantization.quantize_dynamic",
        "weight_type": "int8",
        "activation_type": "uint8 (dynamic, per tensor)",
        "per_channel": True,
        "reduce_range": rr,
        "op_types": ["MatMul"],
        "built_for_kernel": cpu.int8_kernel,
    }
