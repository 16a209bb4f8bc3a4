"""The engine side of constrained decoding: packed bitmasks, penalties, resume with both."""

from __future__ import annotations

import numpy as np

from service.engine.base import SamplingParams, TokenBitmask
from service.engine.onnx_engine import OnnxEngine
from service.engine.sampling import apply_penalties, bitmask_to_bool, sample
from tests.engine_fixtures import SMALL, contrib_int8_dir, engine, prompt, run_to_end, small_int8_dir

__all__ = ["contrib_int8_dir", "engine", "small_int8_dir"]


def _pack(allowed: np.ndarray, vocab: int) -> TokenBitmask:
    bits = np.zeros(-(-vocab // 32) * 32, dtype=np.uint8)
    bits[allowed] = 1
    return TokenBitmask(np.packbits(bits, bitorder="little").view("<u4").copy())


def test_bitmask_unpacks_to_the_allowed_ids() -> None:
    allowed = np.array([0, 5, 31, 32, 33, 999])
    keep = bitmask_to_bool(_pack(allowed, 1000), 1000)
    assert keep.shape == (1000,) and np.flatnonzero(keep).tolist() == allowed.tolist()


def test_bitmask_and_id_array_sample_the_same_token() -> None:
    rng = np.random.default_rng(3)
    logits = rng.normal(size=1000).astype(np.float32)
    allowed = np.sort(rng.choice(1000, size=40, replace=False))
    for index in range(30):
        params = SamplingParams(max_new_tokens=1, temperature=0.8, top_p=0.9, seed=7)
        by_ids = sample(logits, params, index, allowed)
        by_bits = sample(logits, params, index, _pack(allowed, 1000))
        assert by_ids == by_bits and by_ids.token_id in set(allowed.tolist())


def test_penalties_follow_openai_semantics_and_leave_logprobs_raw() -> None:
    logits = np.zeros(8, dtype=np.float32)
    params = SamplingParams(max_new_tokens=1, frequency_penalty=0.5, presence_penalty=1.0)
    penalised = apply_penalties(logits, params, {2: 3, 5: 1})
    assert penalised.tolist() == [0, 0, -2.5, 0, 0, -1.5, 0, 0]
    assert logits.tolist() == [0.0] * 8  # a new array: the model's logits are untouched
    greedy = SamplingParams(max_new_tokens=1, temperature=0.0, presence_penalty=2.0)
    peaked = np.array([0, 0, 1.0, 0], dtype=np.float32)
    out = sample(peaked, greedy, 0, counts={2: 1})
    assert out.token_id != 2  # the repeated token lost its lead
    assert abs(out.logprob - (0.0 - np.log(3 + np.e))) < 1e-6  # the raw distribution, not the penalised one


def test_penalised_run_resumes_with_the_same_tokens(engine: OnnxEngine) -> None:
    params = SamplingParams(max_new_tokens=25, temperature=1.0, seed=4, frequency_penalty=1.5, presence_penalty=0.5)
    engine.add_sequence("full", prompt(9), params)
    full = run_to_end(engine)["full"]
    engine.add_sequence("resumed", prompt(9), params, generated_ids=full[:12])
    assert full[12:] == run_to_end(engine)["resumed"]
    plain = SamplingParams(max_new_tokens=25, temperature=1.0, seed=4)
    engine.add_sequence("plain", prompt(9), plain)
    assert run_to_end(engine)["plain"] != full, "the penalties change what is drawn"


class _EvenBits:
    """A bitmask grammar (even ids only) that records what it was fed and where masks were computed."""

    def __init__(self) -> None:
        self.fed: list[int] = []
        self._mask = _pack(np.arange(0, SMALL.vocab_size, 2), SMALL.vocab_size)

    def allowed_token_ids(self) -> TokenBitmask:
        return self._mask

    def accept(self, token_id: int) -> None:
        self.fed.append(token_id)


def test_bitmask_constraints_in_a_batch(engine: OnnxEngine) -> None:
    a, b = _EvenBits(), _EvenBits()
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=2)
    engine.add_sequence("a", prompt(5), params, constraint=a)
    engine.add_sequence("b", prompt(7, start=4), params, constraint=b)
    engine.add_sequence("free", prompt(6), params)
    out = run_to_end(engine)
    assert all(t % 2 == 0 for t in out["a"] + out["b"])
    assert a.fed == out["a"] and b.fed == out["b"] and len(out["free"]) == 12
