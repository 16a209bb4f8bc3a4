"""The ONNX graphs against a plain numpy forward of the same weights (read back from the graph)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from service.engine.config import DecoderConfig, read_config
from service.engine.graph_standard import weights_from_standard
from service.engine.onnx_engine import OnnxEngine
from service.engine.weights import random_weights, reference_forward
from tests.engine_fixtures import (
    SEED,
    SMALL,
    contrib_fp32_dir,
    contrib_int8_dir,
    greedy,
    prefilled_logits,
    prompt,
    run_to_end,
    small_fp32_dir,
    small_int8_dir,
    small_tied_fp32_dir,
)

__all__ = ["contrib_fp32_dir", "contrib_int8_dir", "small_fp32_dir", "small_int8_dir", "small_tied_fp32_dir"]

ABS_TOL = 2e-4  # fp32 graph vs float64 numpy; logits have std ~2


def _feeds(config: DecoderConfig, ids: list[int], past_len: int = 0) -> dict[str, np.ndarray]:
    n = len(ids)
    feeds = {
        "input_ids": np.array([ids], dtype=np.int64),
        "attention_mask": np.ones((1, past_len + n), dtype=np.int64),
        "position_ids": np.arange(past_len, past_len + n, dtype=np.int64)[None],
    }
    for i in range(config.num_layers):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = np.zeros((1, config.num_kv_heads, 0, config.head_dim), np.float32)
    return feeds


@pytest.mark.parametrize("fixture", ["small_fp32_dir", "small_tied_fp32_dir"])
def test_fp32_graph_matches_numpy_reference(fixture: str, request: pytest.FixtureRequest) -> None:
    model_dir: Path = request.getfixturevalue(fixture)
    config = read_config(model_dir).decoder
    weights = weights_from_standard(onnx.load(str(model_dir / "model.onnx")), config)
    # The graph holds exactly the seeded weights.
    for name, arr in random_weights(config, SEED).items():
        np.testing.assert_array_equal(weights[name], arr)
    ids = prompt(40)
    sess = ort.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    logits = sess.run(["logits"], _feeds(config, ids))[0][0]
    ref = reference_forward(config, weights, np.array(ids))
    err = float(np.abs(logits - ref).max())
    print(f"fp32 vs numpy reference: max abs logit error {err:.2e} (logit std {ref.std():.2f})")
    assert err < ABS_TOL
    assert ref.std() > 0.5  # not a degenerate, flat model


def test_kv_cache_decoding_equals_full_recomputation(small_fp32_dir: Path) -> None:
    config = SMALL
    sess = ort.InferenceSession(str(small_fp32_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    ids = prompt(30)
    full = sess.run(["logits"], _feeds(config, ids))[0][0]
    names = [o.name for o in sess.get_outputs()]
    feeds = _feeds(config, ids[:10])
    outs = dict(zip(names, sess.run(None, feeds), strict=True))
    incremental = [outs["logits"][0]]
    for pos in range(10, 30, 4):  # chunks of 4 after a 10-token prefill
        feeds = _feeds(config, ids[pos : pos + 4], past_len=pos)
        for i in range(config.num_layers):
            for kind in ("key", "value"):
                feeds[f"past_key_values.{i}.{kind}"] = outs[f"present.{i}.{kind}"]
        outs = dict(zip(names, sess.run(None, feeds), strict=True))
        incremental.append(outs["logits"][0])
    err = float(np.abs(np.concatenate(incremental) - full).max())
    assert err < 1e-4, err


def test_contrib_fp32_graph_matches_numpy_reference(contrib_fp32_dir: Path) -> None:
    """GroupQueryAttention + shared KV buffer, through the engine: prefill, chunked resume, decode."""
    weights = random_weights(SMALL, SEED)
    ids = prompt(40)
    ref = reference_forward(SMALL, weights, np.array(ids))
    eng = OnnxEngine(contrib_fp32_dir, intra_op_threads=1)
    errs = []
    for k in (0, 5, 17):  # resume replays k generated tokens one by one after the prompt
        eng.add_sequence("s", ids[:20], greedy(30), generated_ids=ids[20 : 20 + k])
        errs.append(float(np.abs(prefilled_logits(eng, "s") - ref[19 + k]).max()))
        eng.remove_sequence("s")
    print(f"contrib fp32 vs numpy reference: max abs logit error {max(errs):.2e}")
    assert max(errs) < ABS_TOL


@pytest.mark.parametrize(
    ("fp32_fixture", "int8_fixture"),
    [
        ("small_fp32_dir", "small_int8_dir"),
        ("contrib_fp32_dir", "contrib_int8_dir"),
    ],
)
def test_int8_agrees_with_fp32_greedy(fp32_fixture: str, int8_fixture: str, request: pytest.FixtureRequest) -> None:
    """Teacher-forced on the fp32 greedy path: how often int8 picks the same next token."""
    steps = 300
    fp32 = OnnxEngine(request.getfixturevalue(fp32_fixture), intra_op_threads=1)
    int8 = OnnxEngine(request.getfixturevalue(int8_fixture), intra_op_threads=1)
    # max_position 128 bounds one run; several prompts make up the steps.
    agree = total = 0
    max_err = 0.0
    for start in range(0, 100):
        if total >= steps:
            break
        p = prompt(8, start=start * 11 + 1)
        fp32.add_sequence("r", p, greedy(40))
        path = run_to_end(fp32)["r"]
        # Replay the same tokens through both engines and compare each next-token distribution.
        for k in range(len(path)):
            fp32.add_sequence("x", p, greedy(len(path) + 1), generated_ids=path[:k])
            int8.add_sequence("x", p, greedy(len(path) + 1), generated_ids=path[:k])
            lf, li = prefilled_logits(fp32, "x"), prefilled_logits(int8, "x")
            max_err = max(max_err, float(np.abs(lf - li).max()))
            agree += int(np.argmax(lf) == np.argmax(li))
            total += 1
            fp32.remove_sequence("x")
            int8.remove_sequence("x")
    rate = agree / total
    print(f"{int8_fixture} vs fp32: top-1 agreement {rate:.3f} over {total} steps, max abs logit error {max_err:.3f}")
    assert rate >= 0.95
