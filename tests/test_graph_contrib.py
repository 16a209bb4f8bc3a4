"""graph_contrib's int8 weights: symmetric blocks, no zero-point input, and row-independent results."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from service.engine.config import INT8_BLOCK_SIZE
from service.engine.graph_contrib import MS, quantize_blockwise_int8

K, N = 96, 80  # K not a multiple of the block: the last block is zero-padded


def _session(q: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None) -> ort.InferenceSession:
    inputs = ["x", "q", "s"] + (["zp"] if zero_points is not None else [])
    inits = [numpy_helper.from_array(q, "q"), numpy_helper.from_array(scales, "s")]
    if zero_points is not None:
        inits.append(numpy_helper.from_array(zero_points, "zp"))
    node = helper.make_node(
        "MatMulNBits", inputs, ["y"], domain=MS, K=K, N=N, bits=8, block_size=INT8_BLOCK_SIZE, accuracy_level=4
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", N])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _weights() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((N, K)).astype(np.float32)


def test_blocks_are_symmetric_and_close() -> None:
    w = _weights()
    q, scales = quantize_blockwise_int8(w)
    blocks = -(-K // INT8_BLOCK_SIZE)
    assert q.shape == (N, blocks, INT8_BLOCK_SIZE) and q.dtype == np.uint8 and scales.shape == (N * blocks,)
    assert q.min() >= 1 and q.max() <= 255  # codes -127..127 around the zero point 128
    back = (q.astype(np.float32) - 128) * scales.reshape(N, blocks, 1)
    err = np.abs(back.reshape(N, -1)[:, :K] - w)
    assert float(err.max()) <= float(scales.max()) / 2 + 1e-6


def test_no_zero_point_input_equals_explicit_128() -> None:
    """Models built before carry zero points of 128; leaving them out must not change a bit."""
    q, scales = quantize_blockwise_int8(_weights())
    with_zp = _session(q, scales, np.full((N, q.shape[1]), 128, dtype=np.uint8))
    without = _session(q, scales, None)
    rng = np.random.default_rng(1)
    for rows in (1, 3, 16):
        x = rng.standard_normal((rows, K)).astype(np.float32)
        assert np.array_equal(with_zp.run(None, {"x": x})[0], without.run(None, {"x": x})[0])


def test_each_row_independent_of_the_batch() -> None:
    """What batched decoding relies on: a row's result is the same alone or among others."""
    q, scales = quantize_blockwise_int8(_weights())
    sess = _session(q, scales, None)
    x = np.random.default_rng(2).standard_normal((16, K)).astype(np.float32)
    batched = sess.run(None, {"x": x})[0]
    alone = np.concatenate([sess.run(None, {"x": x[i : i + 1]})[0] for i in range(16)])
    assert np.array_equal(batched, alone)
