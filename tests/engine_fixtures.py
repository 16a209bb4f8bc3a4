"""Shared builders for the engine tests: small random models, built once per test session."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from service.engine.base import SamplingParams, TokenOutput
from service.engine.builder import build_random_decoder
from service.engine.config import DecoderConfig
from service.engine.onnx_engine import OnnxEngine

Outputs = dict[str, list[TokenOutput]]

SMALL = DecoderConfig(
    vocab_size=1000,
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    intermediate_size=128,
    max_position=128,
    tie_embeddings=False,
)
SMALL_TIED = DecoderConfig(**{**SMALL.to_dict(), "tie_embeddings": True})
SEED = 7


@pytest.fixture(scope="session")
def small_fp32_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fp32") / "m"
    return build_random_decoder(out, SMALL, SEED, quantize=False, graph="standard", all_logits=True)


@pytest.fixture(scope="session")
def small_tied_fp32_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tied") / "m"
    return build_random_decoder(out, SMALL_TIED, SEED, quantize=False, graph="standard", all_logits=True)


@pytest.fixture(scope="session")
def small_int8_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Standard ops, int8 via quantize_dynamic (the path user-brought models take)."""
    return build_random_decoder(tmp_path_factory.mktemp("int8") / "m", SMALL, SEED, quantize=True, graph="standard")


@pytest.fixture(scope="session")
def contrib_fp32_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_random_decoder(tmp_path_factory.mktemp("cfp32") / "m", SMALL, SEED, quantize=False)


@pytest.fixture(scope="session")
def contrib_int8_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GroupQueryAttention + MatMulNBits int8 (the built-in model's graph)."""
    return build_random_decoder(tmp_path_factory.mktemp("cint8") / "m", SMALL, SEED, quantize=True)


@pytest.fixture(params=["standard", "contrib"])
def engine(request: pytest.FixtureRequest) -> OnnxEngine:
    fixture = "small_int8_dir" if request.param == "standard" else "contrib_int8_dir"
    return OnnxEngine(request.getfixturevalue(fixture), intra_op_threads=1)


def run_to_end(engine: OnnxEngine) -> dict[str, list[int]]:
    """Step until no sequence is active; the tokens each produced."""
    out: dict[str, list[int]] = {}
    for _ in range(10_000):
        if not engine.active_sequence_ids():
            return out
        for seq_id, tok in engine.step().items():
            out.setdefault(seq_id, []).append(tok.token_id)
    raise AssertionError("engine never finished")


def prefilled_logits(engine: OnnxEngine, seq_id: str) -> np.ndarray:
    """Finish a just-added sequence's prefill (which step() does before it samples) and return the
    logits its next token will be sampled from."""
    while not engine._seqs[seq_id].ready:
        engine._prefill_some()
    return engine._seqs[seq_id].logits


def prompt_logits(model_dir: Path, ids: list[int]) -> np.ndarray:
    """The logits a fresh engine samples the first token after `ids` from (a flat copy)."""
    eng = OnnxEngine(model_dir, intra_op_threads=1)
    eng.add_sequence("s", ids, greedy(1))
    return np.asarray(prefilled_logits(eng, "s")).reshape(-1).copy()


def prompt(n: int, start: int = 3) -> list[int]:
    return [(start + 37 * i) % SMALL.vocab_size for i in range(n)]


def greedy(max_new: int = 20, **kw: object) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new, temperature=0.0, **kw)  # type: ignore[arg-type]


def sampled(max_new: int = 30, seed: int = 5, **kw: object) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new, temperature=1.0, top_p=0.95, seed=seed, **kw)  # type: ignore[arg-type]


def assert_batch_invariant(model_dir: Path, threads: int = 1) -> None:
    """Sequences admitted, stepped together and dropped at different steps draw exactly what each draws
    decoded alone: same tokens, same logprobs, bit for bit."""
    rng = np.random.default_rng(3)
    lengths, starts, news = rng.integers(1, 30, 9), rng.integers(0, 900, 9), rng.integers(2, 14, 9)
    specs = [
        (prompt(int(n), start=int(s)), sampled(int(m), seed=i, top_logprobs=3))
        for i, (n, s, m) in enumerate(zip(lengths, starts, news, strict=True))
    ]
    # Admit one every other step: batches grow, shrink and reshuffle slots.
    schedule = BatchSchedule(join_every=2, dropped=(prompt(11), sampled(50)), drop_at=3, remove_at=9)
    assert decode_together(model_dir, specs, schedule, threads) == decode_alone(model_dir, specs, threads)


@dataclass(frozen=True)
class BatchSchedule:
    """When sequences join a shared engine, and a sequence that joins at `drop_at` and leaves at `remove_at`."""

    join_every: int
    dropped: tuple[list[int], SamplingParams]
    drop_at: int
    remove_at: int


def decode_alone(model_dir: Path, specs: list[tuple[list[int], SamplingParams]], threads: int = 1) -> Outputs:
    """Each (prompt, params) decoded by an engine of its own."""
    alone: Outputs = {}
    for i, (ids, params) in enumerate(specs):
        eng = OnnxEngine(model_dir, intra_op_threads=threads)
        eng.add_sequence(str(i), ids, params)
        alone[str(i)] = [o for _ in range(params.max_new_tokens) for o in eng.step().values()]
    return alone


def decode_together(
    model_dir: Path, specs: list[tuple[list[int], SamplingParams]], schedule: BatchSchedule, threads: int = 1
) -> Outputs:
    """The same sequences decoded by one engine, joining and leaving by `schedule` (the dropped one left out)."""
    together = OnnxEngine(model_dir, intra_op_threads=threads)
    got: Outputs = {}
    pending = list(enumerate(specs))
    steps = 0
    while pending or together.active_sequence_ids():
        if pending and steps % schedule.join_every == 0:
            i, (ids, params) = pending.pop(0)
            together.add_sequence(str(i), ids, params)
        if steps == schedule.drop_at:
            together.add_sequence("dropped", *schedule.dropped)
        if steps == schedule.remove_at:
            together.remove_sequence("dropped")
        for seq_id, out in together.step().items():
            got.setdefault(seq_id, []).append(out)
        steps += 1
    got.pop("dropped")
    return got


__all__ = ["np", "SMALL", "SMALL_TIED", "SEED", "run_to_end", "prompt", "greedy"]
