"""Hugging Face-named weights read back from a standard-op decoder graph that torch exported.

torch.onnx.export (and Optimum, which uses it) keeps a parameter's name on its initializer only where
the graph uses the parameter as it is: embeddings, norm gains, biases. A Linear's weight is folded to
its transpose ([in, out]) under a generated name (`onnx::MatMul_123`), and initializers with equal
values are merged into one, the others becoming Identity nodes of it (every norm gain of a freshly
initialised model, zero biases). What still
names them is the consuming node's scope: `/model/layers.0/self_attn/q_proj/MatMul` reads
`model.layers.0.self_attn.q_proj.weight`. So a weight is found by its initializer's name first, then
by the scope of the node that reads it. Nothing is guessed: a weight found neither way is missing.
Merged decoders (Optimum's `If` on use_cache_branch) keep their nodes in subgraphs; those are read too.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import onnx
from onnx import numpy_helper

# The HF module path inside a longer name: "m.model.layers.0..." (a wrapper module) -> "model.layers.0...".
_ROOT = re.compile(r"(?:^|\.)((?:model\.(?:embed_tokens|layers|norm)|lm_head)(?:\..*)?)$")
_FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}


def hf_name(name: str) -> str | None:
    """The HF module path in an initializer name or a node's scope (`/m/model/layers.0/mlp/up_proj/MatMul`
    -> `model.layers.0.mlp.up_proj`), or None when it names no decoder module."""
    dotted = name.strip("/").replace("/", ".")
    m = _ROOT.search(dotted)
    return m.group(1) if m else None


def _nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node, those in If/Loop subgraphs included."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(attr.g)
            for sub in attr.graphs:
                yield from _nodes(sub)


def _initializers(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _initializers(attr.g)
            for sub in attr.graphs:
                yield from _initializers(sub)


def _float(t: onnx.TensorProto) -> np.ndarray:
    return numpy_helper.to_array(t).astype(np.float32, copy=False)


def _by_scope(node: onnx.NodeProto, consts: dict[str, onnx.TensorProto]) -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, HF-layout array) pairs a node's scope says its constant inputs are."""
    scope = hf_name(node.name.rsplit("/", 1)[0]) if "/" in node.name else None
    if scope is None:
        return
    ins = [consts[i] for i in node.input if i in consts]
    if node.op_type == "MatMul" and len(node.input) == 2 and node.input[1] in consts:
        if len(consts[node.input[1]].dims) == 2:
            yield scope + ".weight", _float(consts[node.input[1]]).T  # stored [in, out]; HF is [out, in]
    elif node.op_type == "Gemm" and len(node.input) >= 2 and node.input[1] in consts:
        trans_b = any(a.name == "transB" and a.i for a in node.attribute)
        w = _float(consts[node.input[1]])
        yield scope + ".weight", w if trans_b else w.T
        if len(node.input) == 3 and node.input[2] in consts:
            yield scope + ".bias", _float(consts[node.input[2]])
    elif node.op_type == "Add" and scope.endswith("_proj"):
        for t in ins:
            if len(t.dims) == 1:
                yield scope + ".bias", _float(t)
    elif node.op_type == "Mul" and (scope.endswith("layernorm") or scope == "model.norm"):
        for t in ins:
            if len(t.dims) == 1 and t.dims[0] > 1:
                yield scope + ".weight", _float(t)
    elif node.op_type == "Gather" and scope == "model.embed_tokens" and node.input[0] in consts:
        yield scope + ".weight", _float(consts[node.input[0]])


def weights_from_export(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Every decoder weight the graph names, in HF names and layout ([out, in]), as float32.

    Initializer names win over node scopes: the name is what torch gave the parameter itself."""
    consts = {t.name: t for t in _initializers(model.graph) if t.data_type in _FLOATS}
    nodes = list(_nodes(model.graph))
    for node in nodes:  # merged duplicates: each parameter's own name is an Identity of the one kept
        if node.op_type == "Identity" and node.input[0] in consts:
            consts[node.output[0]] = consts[node.input[0]]
    found: dict[str, np.ndarray] = {}
    for node in nodes:
        for name, array in _by_scope(node, consts):
            found.setdefault(name, array)
    for value_name, t in consts.items():
        named = hf_name(value_name)
        if named is not None and named.endswith((".weight", ".bias")):
            found[named] = _float(t)
    return found
