"""A small helper over onnx.helper for writing graphs node by node."""

from __future__ import annotations

from typing import Any, Literal, overload

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class GraphWriter:
    def __init__(self, prefix: str = "") -> None:
        """`prefix` starts every node, output and constant name (for nodes added to an existing graph)."""
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.prefix = prefix
        self._count = 0
        self._consts: dict[tuple[str, bytes, tuple[int, ...]], str] = {}

    @overload
    def op(self, op_type: str, inputs: list[str], n_out: Literal[1] = 1, *, domain: str = "", **attrs: Any) -> str: ...
    @overload
    def op(self, op_type: str, inputs: list[str], n_out: int, *, domain: str = "", **attrs: Any) -> list[str]: ...
    def op(self, op_type: str, inputs: list[str], n_out: int = 1, *, domain: str = "", **attrs: Any) -> str | list[str]:
        """Add a node; returns its output name (or a list when n_out > 1)."""
        self._count += 1
        base = f"{self.prefix}{op_type}_{self._count}"
        outs = [f"{base}/out{j}" for j in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=base, domain=domain or None, **attrs))
        return outs[0] if n_out == 1 else outs

    def op_named(self, op_type: str, inputs: list[str], outputs: list[str], *, domain: str = "", **attrs: Any) -> None:
        self._count += 1
        name = f"{self.prefix}{op_type}_{self._count}"
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=name, domain=domain or None, **attrs))

    def weight(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def const(self, value: Any, dtype: type = np.int64) -> str:
        """A small constant initializer, deduplicated."""
        arr: np.ndarray = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.tobytes(), arr.shape)
        if key not in self._consts:
            self._consts[key] = self.weight(f"{self.prefix}const_{len(self._consts)}", arr)
        return self._consts[key]

    def last_position(self, x: str) -> str:
        """x [b, s, ...] sliced to its last position along axis 1, [b, 1, ...] (what the head reads)."""
        return str(self.op("Slice", [x, self.const([-1]), self.const([np.iinfo(np.int64).max]), self.const([1])]))

    def model(
        self, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto], opsets: dict[str, int]
    ) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "decoder", inputs, outputs, self.initializers)
        imports = [helper.make_opsetid(d, v) for d, v in opsets.items()]
        model = helper.make_model(graph, opset_imports=imports, producer_name="responses-service")
        model.ir_version = 10
        return model


def tensor_info(name: str, elem: int, shape: list[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64
INT32 = TensorProto.INT32
