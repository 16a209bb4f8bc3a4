"""Per-row int8 (`--block-size row`): one scale per weight row and per activation row, multiplied by
MatMulIntegerToFloat. The same model whichever way it is made, batch-invariant, close to fp32, exact on the
u8u8 kernels a CPU without VNNI gets, and refused where its u8s8 kernels would saturate."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import service.engine.graph_contrib as graph_contrib
import service.engine.onnx_engine as onnx_engine
from service.engine.base import EngineError
from service.engine.builder import build_random_decoder
from service.engine.config import INT8_PER_ROW, read_config
from service.engine.cpu import cpu_features
from service.engine.model_files import find_model_file
from service.engine.onnx_engine import OnnxEngine
from tests.cli_helpers import run_cli
from tests.engine_fixtures import (
    SEED,
    SMALL,
    assert_batch_invariant,
    contrib_fp32_dir,
    greedy,
    prompt,
    prompt_logits,
)

__all__ = ["contrib_fp32_dir"]

NO_VNNI = dataclasses.replace(cpu_features(), avx512_vnni=False, avx_vnni=False, amx_int8=False)


def _ops(model_dir: Path) -> set[str]:
    return {n.op_type for n in onnx.load(str(find_model_file(model_dir)), load_external_data=False).graph.node}


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_random_decoder(tmp_path_factory.mktemp("rows") / "m", SMALL, SEED, quantize=True, block=INT8_PER_ROW)


@pytest.fixture(scope="module")
def rows_u8u8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same model built as on a CPU without VNNI: uint8 weights for MLAS's exact u8u8 kernels."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(graph_contrib, "cpu_features", lambda: NO_VNNI)
        out = tmp_path_factory.mktemp("rows-u8u8") / "m"
        return build_random_decoder(out, SMALL, SEED, quantize=True, block=INT8_PER_ROW)


def test_every_linear_layer_is_per_row_int8_and_config_json_says_so(rows: Path) -> None:
    ops = _ops(rows)
    assert "MatMulIntegerToFloat" in ops and not ops & {"MatMulNBits", "MatMul"}
    assert "QuantizeLinear" in ops and "Round" not in ops  # one node quantizes a row of activations
    scheme = read_config(rows).extra["quantization"]
    assert scheme["scheme"] == "rows_int8" and scheme["block_size"] == "row"
    assert scheme["qgemm"] == ("u8s8" if cpu_features().has_vnni else "u8u8")
    info = json.loads(run_cli("model", "info", str(rows)).stdout)
    assert info["decoding"]["batch_invariant"] is True
    assert info["op_counts"]["MatMulIntegerToFloat"] == 4 * SMALL.num_layers + 1  # qkv, o, gate_up, down; the head


def _row_linear_model(zero_points: bool, weight: np.ndarray) -> onnx.ModelProto:
    g = graph_contrib.GraphWriter()
    zp = graph_contrib.row_zero_points(g, "ids") if zero_points else None
    graph_contrib.row_int8_linear(g, "x", "w", weight, out="y", zero_points=zp)
    k, n = weight.shape[1], weight.shape[0]
    inputs = [
        onnx.helper.make_tensor_value_info(name, t, shape)
        for name, t, shape in (
            ("x", onnx.TensorProto.FLOAT, ["b", "s", k]),
            ("ids", onnx.TensorProto.INT64, ["b", "s"]),
        )
    ]
    outputs = [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["b", "s", n])]
    return g.model(inputs, outputs, {"": 21 if zero_points else 17, graph_contrib.MS: 1})


def test_one_quantize_node_gives_the_bytes_of_divide_round_add_cast() -> None:
    """The built graphs quantize a row with one blocked QuantizeLinear, `model quantize` with four nodes: the same
    bits, ties (x / scale = n + 0.5, rounded to even), all-zero rows and tiny or huge rows included."""
    rng = np.random.default_rng(7)
    weight = rng.standard_normal((24, 40)).astype(np.float32)
    x = rng.standard_normal((3, 5, 40)).astype(np.float32) * np.float32(3)
    x[0, 0] = 0.0
    x[0, 1] = np.float32(1e-20) * x[0, 1]
    x[0, 2] = np.float32(1e20) * x[0, 2]
    x[1, 0] = np.arange(40, dtype=np.float32) - np.float32(19.5)  # evenly spaced, amax 20.5
    x[1, 1, :] = np.float32(0.5) + np.arange(40, dtype=np.float32) % 7
    x[1, 1, 0] = np.float32(127.0)  # amax 127: the scale is 1, so every other x / scale is a tie, k + 0.5
    ids = np.zeros(x.shape[:2], dtype=np.int64)
    got = {}
    for zero_points in (False, True):
        model = _row_linear_model(zero_points, weight)
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        got[zero_points] = sess.run(None, {"x": x, "ids": ids})[0]
    assert np.array_equal(got[True], got[False])
    assert not np.any(got[True][0, 0])  # an all-zero row stays zero, not NaN


def test_quantizing_per_row_gives_the_model_built_per_row(rows: Path, contrib_fp32_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "q"
    result = run_cli("model", "quantize", str(contrib_fp32_dir), str(out), "--block-size", "row")
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_config(out).extra["quantization"]["scheme"] == "rows_int8"
    for ids in (prompt(1), prompt(9, start=40)):
        assert np.array_equal(prompt_logits(out, ids), prompt_logits(rows, ids))


def test_per_row_logits_stay_close_to_fp32(rows: Path, contrib_fp32_dir: Path) -> None:
    for ids in (prompt(5), prompt(20, start=300)):
        exact, got = prompt_logits(contrib_fp32_dir, ids), prompt_logits(rows, ids)
        assert np.abs(got - exact).max() < 0.05 * np.abs(exact).max()
        assert int(np.argmax(got)) == int(np.argmax(exact))


def test_per_row_decodes_batched_bit_identically(rows: Path) -> None:
    """Exact integer sums and row-wise scales: a row's bits never depend on its neighbours."""
    assert_batch_invariant(rows)


def test_the_u8u8_weights_give_the_same_bits(rows: Path, rows_u8u8: Path) -> None:
    """uint8 weights around 128 are the int8 ones shifted: the sums, hence the logits, are identical."""
    scheme = read_config(rows_u8u8).extra["quantization"]
    assert scheme["qgemm"] == "u8u8" and scheme["weight_type"].startswith("uint8")
    for ids in (prompt(3), prompt(17, start=500)):
        assert np.array_equal(prompt_logits(rows_u8u8, ids), prompt_logits(rows, ids))


@pytest.mark.skipif(not cpu_features().has_vnni, reason="u8s8 weights are built only on a CPU with VNNI")
def test_u8s8_weights_are_refused_on_a_cpu_without_vnni(rows: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onnx_engine, "cpu_features", lambda: NO_VNNI)
    with pytest.raises(EngineError, match="VNNI.*rebuild the model on this machine"):
        OnnxEngine(rows, intra_op_threads=1)


def test_u8u8_weights_load_anywhere(rows_u8u8: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onnx_engine, "cpu_features", lambda: NO_VNNI)
    eng = OnnxEngine(rows_u8u8, intra_op_threads=1)
    eng.add_sequence("s", prompt(4), greedy(2))
    assert [o.token_id for _ in range(2) for o in eng.step().values()]


def test_the_parser_takes_row_and_refuses_other_words(tmp_path: Path) -> None:
    result = run_cli("model", "build-random", str(tmp_path / "m"), "--block-size", "rows")
    assert result.returncode == 2 and "must be one of row, 16, 32, 64, 128, 256" in result.stderr
