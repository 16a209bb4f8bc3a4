"""OnnxEngine: a table of sequences stepped together; stops, limits, resume, context overflow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from service.engine.base import EngineError, SamplingParams
from service.engine.model_dir import RANDOM_NAME, ensure_random_model
from service.engine.onnx_engine import OnnxEngine
from tests.engine_fixtures import (
    SMALL,
    assert_batch_invariant,
    contrib_int8_dir,
    engine,
    greedy,
    prompt,
    run_to_end,
    small_int8_dir,
)

__all__ = ["contrib_int8_dir", "engine", "small_int8_dir"]


def _sampled(max_new: int = 30, seed: int = 5, **kw: object) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new, temperature=1.0, top_p=0.95, seed=seed, **kw)  # type: ignore[arg-type]


def test_several_sequences_step_together(engine: OnnxEngine) -> None:
    engine.add_sequence("a", prompt(10), greedy(12))
    engine.add_sequence("b", prompt(5, start=9), _sampled(8))
    first = engine.step()
    assert set(first) == {"a", "b"}
    engine.add_sequence("c", prompt(7, start=2), _sampled(5, seed=1))
    engine.remove_sequence("b")
    engine.remove_sequence("unknown")  # ignored
    out = run_to_end(engine)
    assert len(out["a"]) == 11 and len(out["c"]) == 5 and "b" not in out
    assert engine.active_sequence_ids() == []


@pytest.mark.parametrize("fixture", ["small_int8_dir", "contrib_int8_dir"])
def test_batch_does_not_change_results(fixture: str, request: pytest.FixtureRequest) -> None:
    model_dir: Path = request.getfixturevalue(fixture)
    alone = OnnxEngine(model_dir, intra_op_threads=1)
    alone.add_sequence("x", prompt(9), _sampled(20))
    together = OnnxEngine(model_dir, intra_op_threads=1)
    together.add_sequence("y", prompt(4, start=1), greedy(30))
    together.add_sequence("x", prompt(9), _sampled(20))
    assert run_to_end(alone)["x"] == run_to_end(together)["x"]


def test_max_new_tokens_finishes_with_length(engine: OnnxEngine) -> None:
    engine.add_sequence("a", prompt(4), _sampled(6))
    outs = []
    while engine.active_sequence_ids():
        outs.append(engine.step()["a"])
    assert len(outs) == 6
    assert [o.finish_reason for o in outs] == [None] * 5 + ["length"]
    assert all(o.logprob is not None and o.logprob <= 0 for o in outs)


def test_stop_token_is_returned_and_finishes(engine: OnnxEngine) -> None:
    engine.add_sequence("probe", prompt(6), greedy(10))
    path = run_to_end(engine)["probe"]
    stop = path[3]
    first_stop = path.index(stop)
    engine.add_sequence("a", prompt(6), greedy(10, stop_token_ids=frozenset({stop})))
    outs = []
    while engine.active_sequence_ids():
        outs.append(engine.step()["a"])
    assert [o.token_id for o in outs] == path[: first_stop + 1]
    assert outs[-1].finish_reason == "stop"


def test_resume_continues_like_an_uninterrupted_run(engine: OnnxEngine) -> None:
    params = _sampled(25, seed=11)
    engine.add_sequence("full", prompt(12), params)
    full = run_to_end(engine)["full"]
    engine.add_sequence("resumed", prompt(12), params, generated_ids=full[:10])
    assert full[10:] == run_to_end(engine)["resumed"]


def test_context_full_finishes_with_length(engine: OnnxEngine) -> None:
    n = SMALL.max_position - 3
    engine.add_sequence("a", prompt(n), _sampled(100))
    outs = []
    while engine.active_sequence_ids():
        outs.append(engine.step()["a"])
    assert len(outs) == 3 and outs[-1].finish_reason == "length"


def test_prompt_overflow_raises(engine: OnnxEngine) -> None:
    with pytest.raises(EngineError):
        engine.add_sequence("a", prompt(SMALL.max_position), greedy())
    with pytest.raises(EngineError):
        engine.add_sequence("b", prompt(SMALL.max_position - 5), greedy(), generated_ids=[1] * 5)
    with pytest.raises(EngineError):
        engine.add_sequence("c", [], greedy())
    assert engine.active_sequence_ids() == []


class _OnlyEvenAfterFirst:
    """A toy grammar: allows even ids only, and records what it was fed."""

    def __init__(self) -> None:
        self.fed: list[int] = []

    def allowed_token_ids(self) -> np.ndarray | None:
        return np.arange(0, SMALL.vocab_size, 2)

    def accept(self, token_id: int) -> None:
        self.fed.append(token_id)


def test_constraint_masks_and_is_fed(engine: OnnxEngine) -> None:
    grammar = _OnlyEvenAfterFirst()
    engine.add_sequence("a", prompt(5), _sampled(15), constraint=grammar)
    toks = run_to_end(engine)["a"]
    assert all(t % 2 == 0 for t in toks)
    assert grammar.fed == toks


def test_random_harmony_model_generates() -> None:
    model_dir = ensure_random_model(progress=False)
    eng = OnnxEngine(model_dir)
    assert eng.model_id == RANDOM_NAME and eng.max_context == 4096
    eng.add_sequence("a", [200006, 17360, 200008, 12194, 200007], _sampled(20, top_logprobs=2))
    out = run_to_end(eng)["a"]
    assert len(out) == 20 and len(set(out)) > 5 and max(out) < 201_088


@pytest.mark.parametrize("threads", [1, 2])
def test_batched_step_is_batch_invariant(contrib_int8_dir: Path, threads: int) -> None:
    """The contrib graph decodes all active sequences in one run; each row's logits must not depend on
    the others (MatMulNBits accuracy_level 4 quantizes activations per row block), so sequences stepped
    together draw exactly what each draws alone: same tokens, same logprobs, bit for bit. This is what
    lets a resume (replayed at batch 1) reproduce a run that was decoded in a batch."""
    assert_batch_invariant(contrib_int8_dir, threads)


def test_batched_run_resumes_at_batch_one(contrib_int8_dir: Path) -> None:
    eng = OnnxEngine(contrib_int8_dir, intra_op_threads=1)
    params = _sampled(20, seed=4)
    for i in range(4):
        eng.add_sequence(f"s{i}", prompt(6 + i, start=i), params)
    full = run_to_end(eng)
    resumed = OnnxEngine(contrib_int8_dir, intra_op_threads=1)
    resumed.add_sequence("r", prompt(8, start=2), params, generated_ids=full["s2"][:7])
    assert run_to_end(resumed)["r"] == full["s2"][7:]


def test_decode_runs_keep_their_binding_until_the_pool_changes(contrib_int8_dir: Path) -> None:
    """A decode run rebinds only its inputs: the KV tensors of its slots stay bound between runs, until the pool
    replaces its arrays (it grew for newcomers, or emptied when idle), when they are bound again. The tokens are
    those of an engine that decodes the sequence alone."""
    alone = OnnxEngine(contrib_int8_dir, intra_op_threads=1)
    alone.add_sequence("a", prompt(8), _sampled(16, seed=2))
    expected = run_to_end(alone)["a"]

    eng = OnnxEngine(contrib_int8_dir, intra_op_threads=1)
    eng.add_sequence("a", prompt(8), _sampled(16, seed=2))
    tokens = [eng.step()["a"].token_id for _ in range(4)]
    bound = eng._bound[(0, 1)]
    tokens.append(eng.step()["a"].token_id)
    assert eng._bound[(0, 1)] is bound  # the same binding, run again
    generation = eng._pool.generation
    eng.add_sequence("b", prompt(5, start=3), greedy(6))  # the pool grows: new arrays
    eng.add_sequence("c", prompt(6, start=7), greedy(6))
    while eng.active_sequence_ids():
        step = eng.step()
        if "a" in step:
            tokens.append(step["a"].token_id)
    assert eng._pool.generation > generation and tokens == expected
    eng.add_sequence("d", prompt(8), _sampled(16, seed=2))  # the pool was cleared when idle: bound again
    again = [eng.step()["d"].token_id for _ in range(3)]
    assert eng._bound[(0, 1)] is not bound and eng._bound[(0, 1)].generation == eng._pool.generation
    assert again + run_to_end(eng)["d"] == expected
