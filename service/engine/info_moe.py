"""What `model info` says about mixture-of-experts graphs (gpt-oss): read off the graph's nodes."""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import onnx  # the engine imports this module; `import onnx` waits until a graph is read

_EXPERT_OPS = ("MoE", "QMoE")


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def logical_parameters(model: onnx.ModelProto) -> tuple[int, int]:
    """(all weights, weights a token does not read: unchosen experts, other embedding rows); codes unpacked."""
    dims = {t.name: int(np.prod(t.dims)) for t in model.graph.initializer}
    packed: dict[str, int] = {}  # initializer -> elements per stored byte
    idle = 0
    for node in model.graph.node:
        attrs = _attrs(node)
        if node.op_type == "MatMulNBits" and len(node.input) > 1:
            packed[node.input[1]] = 8 // int(attrs.get("bits", 4))
        if node.op_type == "QMoE":
            per_byte = 8 // int(attrs.get("expert_weight_bits", 4))
            for i in (2, 5, 8):
                if len(node.input) > i and node.input[i]:
                    packed[node.input[i]] = per_byte
    for node in model.graph.node:
        if node.op_type not in _EXPERT_OPS:
            continue
        k = int(_attrs(node).get("k", 1))
        weight_inputs = (2, 3, 4, 5, 6, 7) if node.op_type == "MoE" else (2, 4, 5, 7)
        experts = next(t.dims[0] for t in model.graph.initializer if t.name == node.input[2])
        names = [node.input[i] for i in weight_inputs if i < len(node.input)]
        total = sum(dims.get(name, 0) * packed.get(name, 1) for name in names)
        idle += total * (experts - k) // experts
    for node in model.graph.node:  # the embedding: a token reads one row
        if node.op_type == "Gather" and node.input[1] == "input_ids" and node.input[0] in dims:
            table = next(t for t in model.graph.initializer if t.name == node.input[0])
            idle += (table.dims[0] - 1) * int(np.prod(table.dims[1:]))
    everything = sum(n * packed.get(name, 1) for name, n in dims.items())
    scales = sum(
        dims[n]
        for node in model.graph.node
        if node.op_type in ("QMoE", "MatMulNBits")
        for n in node.input[1:]
        if n.endswith(("scales", "zp")) and n in dims
    )
    return everything - scales, idle


def describe_moe(model: onnx.ModelProto) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """({experts, top_k, layers, expert_op, expert_bits, activation, ...} or None, attention facts)."""
    moe_nodes = [n for n in model.graph.node if n.op_type in _EXPERT_OPS]
    gqa = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    windows = [int(_attrs(n).get("local_window_size", -1)) for n in gqa]
    attention = {
        "op": "GroupQueryAttention" if gqa else None,
        "sinks": any(len(n.input) > 11 and bool(n.input[11]) for n in gqa),
        "sliding_window": max(windows, default=-1) if any(w > 0 for w in windows) else None,
        "sliding_layers": [i for i, w in enumerate(windows) if w > 0],
        "window_sized_cache_layers": [i for i, n in enumerate(gqa) if _attrs(n).get("sliding_window_cache")],
    }
    if not moe_nodes:
        return None, attention
    first = moe_nodes[0]
    attrs = _attrs(first)
    fc1 = next(t for t in model.graph.initializer if t.name == first.input[2])
    activation = attrs.get("activation_type", b"relu")
    return {
        "experts": int(fc1.dims[0]),
        "top_k": int(attrs.get("k", 1)),
        "layers": len(moe_nodes),
        "expert_op": first.op_type,
        "expert_bits": int(attrs.get("expert_weight_bits", 4)) if first.op_type == "QMoE" else None,
        "expert_block_size": attrs.get("block_size") if first.op_type == "QMoE" else None,
        "activation": activation.decode() if isinstance(activation, bytes) else activation,
        "swiglu_limit": attrs.get("swiglu_limit"),
        "swiglu_alpha": attrs.get("activation_alpha"),
    }, attention


def expert_bits(model_file: Path) -> set[int]:
    """The bit widths of a graph's QMoE experts (empty without QMoE); reads the graph, not its weights."""
    if not _holds_bytes(model_file, b"QMoE"):  # no node of that type: skip parsing (a second for big graphs)
        return set()
    import onnx

    model = onnx.load(str(model_file), load_external_data=False)
    nodes = [n for n in model.graph.node if n.op_type == "QMoE"]
    return {int(_attrs(n).get("expert_weight_bits", 4)) for n in nodes}


def _holds_bytes(path: Path, needle: bytes) -> bool:
    """Whether the file contains `needle` anywhere (an op type is stored as plain bytes in the protobuf)."""
    with path.open("rb") as f:
        if path.stat().st_size == 0:
            return False
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return data.find(needle) != -1
