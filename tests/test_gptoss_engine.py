"""The gpt-oss graph in the engine: batching and resume as exact as for the other graphs.

A miniature with the real structure (experts, top-k, sinks, alternating sliding/full layers with
window-sized caches, YaRN) and seeded random weights, built with numpy only (no torch): sequences
run longer than the window, so the window caches evict while sequences join, leave and move slots.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from service.engine.base import SamplingParams
from service.engine.config import DecoderConfig
from service.engine.cpu import cpu_features
from service.engine.gptoss import SLIDING, GptOssSpec, random_gptoss_weights, yarn_inv_freq
from service.engine.graph_gptoss import quantize_experts, write_gptoss_model
from service.engine.info import model_info
from service.engine.onnx_engine import OnnxEngine
from tests.engine_fixtures import BatchSchedule, decode_alone, decode_together

MINI = DecoderConfig(
    vocab_size=512,
    hidden_size=64,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    intermediate_size=64,
    max_position=256,
    rope_theta=150000.0,
    rms_norm_eps=1e-5,
    tie_embeddings=False,
)
WINDOW = 8


def _spec(bits: int | None) -> GptOssSpec:
    return GptOssSpec(
        num_experts=6,
        top_k=2,
        sliding_window=WINDOW,
        layer_types=tuple(SLIDING if i % 2 == 0 else "full_attention" for i in range(MINI.num_layers)),
        yarn={"factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "original_max_position_embeddings": 4096},
        expert_bits=bits,
    )


@pytest.fixture(scope="module", params=[4, 8], ids=["int4-experts", "int8-experts"])
def mini_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = _spec(request.param)
    out = tmp_path_factory.mktemp(f"gptoss-int{request.param}")
    return write_gptoss_model(out, MINI, spec, random_gptoss_weights(MINI, spec, 11), quantize_dense=True)


def _sampled(max_new: int, seed: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new, temperature=1.0, top_p=0.95, seed=seed, top_logprobs=2)


def _prompt(n: int, start: int) -> list[int]:
    return [(start + 37 * i) % MINI.vocab_size for i in range(n)]


def test_batched_decode_is_batch_invariant(mini_dir: Path) -> None:
    """Sequences decoded together (joining, leaving, moving slots) draw exactly what each draws alone."""
    specs = [(_prompt(3 + 5 * i, 17 * i), _sampled(6 + 4 * i, seed=i)) for i in range(5)]
    # The dropped sequence's slot is taken over by the last slot's sequence, window caches and all.
    schedule = BatchSchedule(join_every=3, dropped=(_prompt(20, 5), _sampled(40, seed=9)), drop_at=1, remove_at=13)
    assert decode_together(mini_dir, specs, schedule) == decode_alone(mini_dir, specs)
    assert max(len(ids) + p.max_new_tokens for ids, p in specs) > 3 * WINDOW


def test_batching_follows_what_this_cpu_keeps_bit_identical(mini_dir: Path) -> None:
    """4-bit experts batch only where the CPU's kernels give a row the same bits in a batch (VNNI); elsewhere
    the engine decodes one sequence per run, and `model info` says so."""
    bits = json.loads((mini_dir / "config.json").read_text())["gpt_oss"]["expert_bits"]
    batches = bits == 8 or cpu_features().int4_experts_batch_invariant
    assert OnnxEngine(mini_dir, intra_op_threads=1, max_batch=16).max_batch == (16 if batches else 1)
    assert model_info(mini_dir)["decoding"]["batched"] is batches


def test_resume_replays_to_the_same_continuation(mini_dir: Path) -> None:
    """A run decoded in a batch, resumed at batch 1 from its logged tokens, continues bit for bit."""
    eng = OnnxEngine(mini_dir, intra_op_threads=1)
    params = _sampled(30, seed=4)
    for i in range(3):
        eng.add_sequence(f"s{i}", _prompt(5 + 3 * i, i), params)
    full: dict[str, list[int]] = {}
    while eng.active_sequence_ids():
        for seq_id, out in eng.step().items():
            full.setdefault(seq_id, []).append(out.token_id)
    resumed = OnnxEngine(mini_dir, intra_op_threads=1)
    resumed.add_sequence("r", _prompt(8, 1), params, generated_ids=full["s1"][:17])
    rest: list[int] = []
    while resumed.active_sequence_ids():  # the replay is spread over the first steps (chunked prefill)
        rest.extend(out.token_id for out in resumed.step().values())
    assert rest == full["s1"][17:]


def test_window_layers_hold_only_the_window(mini_dir: Path) -> None:
    eng = OnnxEngine(mini_dir, intra_op_threads=1)
    eng.add_sequence("a", _prompt(40, 3), _sampled(2, seed=0))
    rows = [arr.shape[2] for arr in eng._pool.arrays]
    assert rows == [WINDOW, WINDOW, MINI.max_position, MINI.max_position] * 2


def test_model_info_describes_the_mixture_of_experts(mini_dir: Path) -> None:
    info = model_info(mini_dir)
    moe = info["mixture_of_experts"]
    assert moe["experts"] == 6 and moe["top_k"] == 2 and moe["layers"] == MINI.num_layers
    assert moe["expert_op"] == "QMoE" and moe["expert_bits"] in (4, 8)
    assert info["attention"]["sliding_window"] == WINDOW and info["attention"]["sinks"] is True
    assert info["attention"]["sliding_layers"] == [0, 2]
    assert 0 < info["active_parameters"] < info["parameters"]


def test_build_random_gptoss_shape_from_the_cli(tmp_path: Path) -> None:
    out = tmp_path / "m"
    cmd = [sys.executable, "-m", "service", "model", "build-random", "--shape", "gpt-oss-tiny", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "SERVICE_INTRA_OP_THREADS": "1"})
    meta = json.loads((out / "config.json").read_text())
    assert meta["gpt_oss"]["expert_bits"] == 4 and meta["graph"] == "gpt_oss"
    eng = OnnxEngine(out, intra_op_threads=1)
    eng.add_sequence("a", [1, 2, 3], SamplingParams(max_new_tokens=5, temperature=0.0))
    outs = [eng.step()["a"] for _ in range(5)]
    assert outs[-1].finish_reason == "length" and all(0 <= o.token_id < meta["vocab_size"] for o in outs)


def test_quantize_experts_round_trips() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 8, 64)).astype(np.float32)
    for bits in (4, 8):
        codes, scales = quantize_experts(w, bits)
        if bits == 4:
            codes = np.stack([codes & 0xF, codes >> 4], axis=-1).reshape(3, 8, 64)
        back = (codes.astype(np.float32) - (1 << (bits - 1))).reshape(3, 8, 2, 32) * scales[..., None]
        assert np.abs(back.reshape(w.shape) - w).max() <= scales.max() / 2 + 1e-6


def test_yarn_scales_low_frequencies_and_attention() -> None:
    plain, one = yarn_inv_freq(64, 150000.0, None)
    yarn, scale = yarn_inv_freq(64, 150000.0, _spec(4).yarn)
    assert one == 1.0 and scale == pytest.approx(0.1 * np.log(32.0) + 1.0)
    assert yarn[0] == pytest.approx(plain[0])  # high frequencies extrapolate
    assert yarn[-1] == pytest.approx(plain[-1] / 32.0)  # low frequencies interpolate by the factor
