"""Chunked prefill inside step(): prompts are prefilled in bounded chunks between decode runs, and not a
sampled token or logprob changes (vs one chunk, vs a sequence alone); running sequences keep getting a
token every step while a long prompt arrives, in parts paced by time while they decode; removal and failure
during a prefill."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.engine.base import EngineError, SamplingParams, TokenOutput
from service.engine.onnx_engine import OnnxEngine
from service.engine.prefill_pacer import PrefillPacer
from tests.engine_fixtures import SMALL, contrib_int8_dir, greedy, prompt, small_int8_dir

__all__ = ["contrib_int8_dir", "small_int8_dir"]

LAYOUTS = ["small_int8_dir", "contrib_int8_dir"]
LONG = SMALL.max_position - 30  # a prompt many budgets long


def _sampled(max_new: int, seed: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new, temperature=1.0, top_p=0.95, seed=seed, top_logprobs=2)


def _outputs(engine: OnnxEngine) -> dict[str, list[TokenOutput]]:
    got: dict[str, list[TokenOutput]] = {}
    while engine.active_sequence_ids():
        for seq_id, out in engine.step().items():
            got.setdefault(seq_id, []).append(out)
    return got


def _alone(
    model_dir: Path, ids: list[int], params: SamplingParams, generated: list[int] | None = None
) -> list[TokenOutput]:
    """What a sequence yields alone, its prompt prefilled in one step (the behaviour before chunking)."""
    engine = OnnxEngine(model_dir, intra_op_threads=1, prefill_tokens=SMALL.max_position)
    engine.add_sequence("x", ids, params, generated_ids=generated or ())
    return _outputs(engine)["x"]


@pytest.mark.parametrize("fixture", LAYOUTS)
@pytest.mark.parametrize("budget", [2, 5, 16])
def test_chunked_prefill_samples_what_one_chunk_samples(
    fixture: str, budget: int, request: pytest.FixtureRequest
) -> None:
    model_dir: Path = request.getfixturevalue(fixture)
    specs = {"a": (prompt(LONG, start=5), _sampled(12, seed=1)), "b": (prompt(41, start=8), _sampled(9, seed=2))}
    chunked = OnnxEngine(model_dir, intra_op_threads=1, prefill_tokens=budget)
    for seq_id, (ids, params) in specs.items():
        chunked.add_sequence(seq_id, ids, params)
    got = _outputs(chunked)
    assert got == {seq_id: _alone(model_dir, ids, params) for seq_id, (ids, params) in specs.items()}


@pytest.mark.parametrize(("fixture", "spread"), [("small_int8_dir", False), ("contrib_int8_dir", True)])
def test_a_long_prompt_arriving_does_not_stall_running_sequences(
    fixture: str, spread: bool, request: pytest.FixtureRequest
) -> None:
    """On the shared-buffer graph the newcomer's prompt is spread over many steps; the standard layout keeps
    its fixed prefill chunks (the whole prompt here), but running sequences get their token all the same."""
    model_dir: Path = request.getfixturevalue(fixture)
    budget = 8
    engine = OnnxEngine(model_dir, intra_op_threads=1, prefill_tokens=budget)
    running = {"r1": (prompt(6, start=1), greedy(40)), "r2": (prompt(9, start=2), _sampled(40, seed=3))}
    for seq_id, (ids, params) in running.items():
        engine.add_sequence(seq_id, ids, params)
    got: dict[str, list[TokenOutput]] = {}
    while len(got) < 2:
        for seq_id, out in engine.step().items():
            got.setdefault(seq_id, []).append(out)
    newcomer = (prompt(LONG, start=11), _sampled(10, seed=4))
    engine.add_sequence("new", *newcomer)
    steps_until_first = 0
    while "new" not in got:
        assert engine.prefilling_sequence_ids() == ["new"]
        step = engine.step()
        steps_until_first += 1
        assert {"r1", "r2"} <= set(step), "a running sequence got no token from a step"
        for seq_id, token in step.items():
            got.setdefault(seq_id, []).append(token)
    assert steps_until_first >= (LONG // budget if spread else 1)
    for seq_id, token_list in _outputs(engine).items():
        got[seq_id].extend(token_list)
    assert got["new"] == _alone(model_dir, *newcomer)
    for seq_id, (ids, params) in running.items():
        assert got[seq_id] == _alone(model_dir, ids, params)


@pytest.mark.parametrize("fixture", LAYOUTS)
def test_resume_with_generated_tokens_is_bit_identical(fixture: str, request: pytest.FixtureRequest) -> None:
    model_dir: Path = request.getfixturevalue(fixture)
    ids, params = prompt(50, start=4), _sampled(30, seed=6)
    full = _alone(model_dir, ids, params)
    engine = OnnxEngine(model_dir, intra_op_threads=1, prefill_tokens=4)
    engine.add_sequence("busy", prompt(7), greedy(60))  # decoding beside the replay
    engine.add_sequence("r", ids, params, generated_ids=[o.token_id for o in full[:13]])
    assert _outputs(engine)["r"] == full[13:]


def test_removal_during_prefill_leaves_the_others_exact(contrib_int8_dir: Path) -> None:
    engine = OnnxEngine(contrib_int8_dir, intra_op_threads=1, prefill_tokens=6)
    specs = {"a": (prompt(5, start=1), _sampled(20, seed=1)), "c": (prompt(12, start=3), _sampled(15, seed=2))}
    engine.add_sequence("a", *specs["a"])
    engine.add_sequence("gone", prompt(LONG, start=7), _sampled(10, seed=9))
    got: dict[str, list[TokenOutput]] = {}
    for _ in range(3):
        for seq_id, out in engine.step().items():
            got.setdefault(seq_id, []).append(out)
    assert engine.prefilling_sequence_ids() == ["gone"]
    engine.remove_sequence("gone")
    engine.add_sequence("c", *specs["c"])  # takes the freed slot
    for seq_id, outs in _outputs(engine).items():
        got.setdefault(seq_id, []).extend(outs)
    assert "gone" not in got and engine.active_sequence_ids() == [] and engine.pop_failures() == {}
    assert got == {seq_id: _alone(contrib_int8_dir, ids, params) for seq_id, (ids, params) in specs.items()}


@pytest.mark.parametrize("fixture", LAYOUTS)
def test_a_failing_prefill_fails_its_sequence_only(
    fixture: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir: Path = request.getfixturevalue(fixture)
    engine = OnnxEngine(model_dir, intra_op_threads=1, prefill_tokens=8)
    poison = prompt(LONG, start=13)
    original = engine._forward

    def forward(seq: object, ids: list[int]) -> None:
        if ids and ids[-1] == poison[-1] and len(ids) > 1:  # the poisoned prompt's last chunk
            raise RuntimeError("ORT says no")
        original(seq, ids)  # type: ignore[arg-type]

    monkeypatch.setattr(engine, "_forward", forward)
    ok = (prompt(6, start=2), _sampled(25, seed=5))
    engine.add_sequence("ok", *ok)
    engine.add_sequence("bad", poison, greedy(5))
    got: dict[str, list[TokenOutput]] = {}
    failures: dict[str, EngineError] = {}
    while engine.active_sequence_ids():
        for seq_id, out in engine.step().items():
            got.setdefault(seq_id, []).append(out)
        failures.update(engine.pop_failures())
    assert list(failures) == ["bad"] and "ORT says no" in str(failures["bad"])
    assert "bad" not in got
    monkeypatch.undo()
    assert got["ok"] == _alone(model_dir, *ok)


def test_validation_errors_are_still_raised_at_once(contrib_int8_dir: Path) -> None:
    engine = OnnxEngine(contrib_int8_dir, intra_op_threads=1, prefill_tokens=4)
    with pytest.raises(EngineError):
        engine.add_sequence("a", prompt(SMALL.max_position), greedy())
    with pytest.raises(EngineError):
        engine.add_sequence("b", [SMALL.vocab_size], greedy())
    assert engine.active_sequence_ids() == [] and engine.pop_failures() == {}


def test_prefix_cache_with_chunked_prefill_changes_nothing(contrib_int8_dir: Path) -> None:
    first, params = prompt(60, start=2), _sampled(10, seed=7)
    second = [*first, *prompt(23, start=17)]  # the next turn: the first prompt, then more
    cached = OnnxEngine(contrib_int8_dir, intra_op_threads=1, prefill_tokens=7, prefix_cache_bytes=1 << 24)
    cached.add_sequence("t1", first, params)
    _outputs(cached)
    cached.add_sequence("t2", second, params)
    assert cached.prefix_cache is not None and cached.prefix_cache.hits > 0
    assert _outputs(cached)["t2"] == _alone(contrib_int8_dir, second, params)


def test_a_prefilling_sequence_moved_between_decoding_ones_keeps_batches_exact(contrib_int8_dir: Path) -> None:
    """A finished sequence's slot is filled by the last one; when that one is still prefilling, it sits
    between decoding sequences and step() must regroup the slots before its batched decode run."""
    engine = OnnxEngine(contrib_int8_dir, intra_op_threads=1, prefill_tokens=4)
    specs = {name: (prompt(3, start=i), _sampled(30 if name != "b" else 10, seed=i)) for i, name in enumerate("abcd")}
    for seq_id, (ids, params) in specs.items():
        engine.add_sequence(seq_id, ids, params)
    got: dict[str, list[TokenOutput]] = {}
    while len(got) < 4:
        for seq_id, out in engine.step().items():
            got.setdefault(seq_id, []).append(out)
    specs["p"] = (prompt(LONG, start=21), _sampled(5, seed=8))
    engine.add_sequence("p", *specs["p"])  # the last slot; "b" ends while it prefills
    for seq_id, outs in _outputs(engine).items():
        got.setdefault(seq_id, []).extend(outs)
    assert got == {seq_id: _alone(contrib_int8_dir, ids, params) for seq_id, (ids, params) in specs.items()}


class _FrozenPacer(PrefillPacer):
    """A pacer whose measures are given, not taken (so the test does not depend on this machine's speed)."""

    def __init__(self, ratio: float, decode_seconds: float, prefill_seconds_per_token: float) -> None:
        super().__init__(ratio, floor=4)
        self.decode_seconds, self.prefill_seconds_per_token = decode_seconds, prefill_seconds_per_token

    def observe_decode(self, seconds: float) -> None:
        pass

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        pass


def test_the_pacer_bounds_a_steps_prefill_by_decode_steps_only_while_others_decode() -> None:
    pacer = PrefillPacer(2.0, floor=32)
    assert pacer.budget(256, decoding=True) == 256  # nothing measured yet
    pacer.observe_decode(0.100)
    pacer.observe_prefill(1, 5.0)  # a replayed token says nothing of a prompt token's cost
    assert pacer.budget(256, decoding=True) == 256
    pacer.observe_prefill(50, 0.250)  # 5 ms a prompt token
    assert pacer.budget(256, decoding=True) == 40  # 2 x 100 ms of prefill
    assert pacer.budget(256, decoding=False) == 256  # alone, a newcomer gets the token budget
    assert pacer.budget(30, decoding=True) == 30  # never above the token budget
    pacer.observe_decode(0.020)  # smoothed: 60 ms
    assert pacer.budget(256, decoding=True) == 32  # 24 tokens, raised to the floor
    assert PrefillPacer(0.0).budget(256, decoding=True) == 256  # 0: the token budget alone


def test_a_newcomer_beside_decoding_sequences_is_prefilled_in_paced_parts_and_samples_the_same(
    contrib_int8_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Token budget 64; the pacer allows 2 x 10 ms / 1 ms = 20 tokens a step while anyone decodes."""
    engine = OnnxEngine(contrib_int8_dir, intra_op_threads=1, prefill_tokens=64)
    engine.prefill_pacer = _FrozenPacer(2.0, decode_seconds=0.010, prefill_seconds_per_token=0.001)
    runs: list[int] = []
    original = engine._forward

    def forward(seq: object, ids: list[int]) -> None:
        if len(ids) > 1:
            runs.append(len(ids))
        original(seq, ids)  # type: ignore[arg-type]

    monkeypatch.setattr(engine, "_forward", forward)
    first = (prompt(LONG, start=3), _sampled(40, seed=1))
    engine.add_sequence("first", *first)
    got: dict[str, list[TokenOutput]] = {}
    prefill_per_step: list[int] = []
    while "first" not in got:
        runs.clear()
        for seq_id, out in engine.step().items():
            got.setdefault(seq_id, []).append(out)
        prefill_per_step.append(sum(runs))
    assert prefill_per_step[0] == 64  # alone: the whole token budget
    newcomer = (prompt(LONG - 10, start=9), _sampled(6, seed=2))
    engine.add_sequence("new", *newcomer)
    prefill_per_step = []
    while "new" not in got:
        runs.clear()
        step = engine.step()
        assert "first" in step, "the decoding sequence got no token from a step"
        for seq_id, out in step.items():
            got.setdefault(seq_id, []).append(out)
        prefill_per_step.append(sum(runs))
    assert max(prefill_per_step) <= 21 and sum(prefill_per_step) == LONG - 10  # 20, or 21 not to leave 1 alone
    assert len(prefill_per_step) >= (LONG - 10) // 21
    monkeypatch.undo()
    for seq_id, outs in _outputs(engine).items():
        got[seq_id].extend(outs)
    assert got == {"first": _alone(contrib_int8_dir, *first), "new": _alone(contrib_int8_dir, *newcomer)}
