"""Sampling: greedy, filters, constraint masks, and draws that depend only on (seed, token index)."""

from __future__ import annotations

import dataclasses

import numpy as np

from service.engine.base import SamplingParams, TokenBitmask
from service.engine.sampling import draw_uniform, sample
from tests import reference_sampling

V = 5000


def _logits(seed: int = 0, scale: float = 2.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(V) * scale).astype(np.float32)


def _p(**kw: object) -> SamplingParams:
    return SamplingParams(max_new_tokens=10, **kw)  # type: ignore[arg-type]


def test_greedy_is_argmax_with_logprob() -> None:
    logits = _logits()
    out = sample(logits, _p(temperature=0.0, top_logprobs=3), token_index=0)
    assert out.token_id == int(np.argmax(logits))
    ref = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum())
    assert abs(out.logprob - ref[out.token_id]) < 1e-5
    assert [t for t, _ in out.top_logprobs] == list(np.argsort(-logits)[:3])
    assert all(abs(lp - ref[t]) < 1e-5 for t, lp in out.top_logprobs)


def test_same_seed_and_index_same_token() -> None:
    logits = _logits()
    params = _p(temperature=1.0, seed=42)
    a = [sample(logits, params, i).token_id for i in range(50)]
    b = [sample(logits, params, i).token_id for i in range(50)]
    assert a == b
    assert len(set(a)) > 10  # draws differ across token indices
    other = [sample(logits, _p(temperature=1.0, seed=43), i).token_id for i in range(50)]
    assert other != a


def test_draw_depends_only_on_seed_and_index() -> None:
    # Order of calls and what was drawn before do not matter: a resumed run redraws the same.
    forward = [draw_uniform(9, i) for i in range(20)]
    backward = [draw_uniform(9, i) for i in reversed(range(20))][::-1]
    assert forward == backward
    logits = _logits()
    params = _p(temperature=0.8, seed=9)
    assert sample(logits, params, 17).token_id == sample(logits, params, 17).token_id


def test_sampling_follows_the_distribution() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.2, 0.0] + [0.0] * 4, dtype=np.float64) + 1e-30).astype(np.float32)
    counts = np.bincount([sample(logits, _p(seed=1), i).token_id for i in range(4000)], minlength=8)
    np.testing.assert_allclose(counts[:3] / 4000, [0.5, 0.3, 0.2], atol=0.03)
    assert counts[3:].sum() == 0


def test_top_k_restricts() -> None:
    logits = _logits(scale=0.5)
    top = set(np.argsort(-logits)[:5].tolist())
    drawn = {sample(logits, _p(top_k=5, seed=3), i).token_id for i in range(300)}
    assert drawn <= top and len(drawn) >= 4


def test_top_p_restricts_to_nucleus() -> None:
    logits = _logits(scale=3.0)
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    order = np.argsort(-probs)
    nucleus = set(order[: int(np.searchsorted(np.cumsum(probs[order]), 0.5)) + 1].tolist())
    drawn = {sample(logits, _p(top_p=0.5, seed=4), i).token_id for i in range(500)}
    assert drawn <= nucleus and len(drawn) > 1


def test_top_p_on_flat_distribution() -> None:
    logits = _logits(scale=0.1)  # nucleus larger than the prefetched 1024 best tokens
    drawn = {sample(logits, _p(top_p=0.9, seed=5), i).token_id for i in range(300)}
    worst = set(np.argsort(logits)[: V // 20].tolist())  # bottom 5% is outside a 90% nucleus
    assert not drawn & worst and len(drawn) > 200


def test_constraint_mask_obeyed() -> None:
    logits = _logits()
    allowed = np.array([11, 22, 33])
    for params in (_p(temperature=0.0), _p(seed=1), _p(top_k=2, seed=2), _p(top_p=0.3, seed=3)):
        for i in range(50):
            assert sample(logits, params, i, allowed).token_id in {11, 22, 33}


def test_temperature_sharpens() -> None:
    logits = _logits(scale=1.0)
    best = int(np.argmax(logits))
    cold = sum(sample(logits, _p(temperature=0.05, seed=1), i).token_id == best for i in range(200))
    hot = sum(sample(logits, _p(temperature=1.0, seed=1), i).token_id == best for i in range(200))
    assert cold > 150 and hot < 50


# -- the fast path draws exactly what the code before it drew (tests/reference_sampling.py) -------------


def _mixes() -> list[SamplingParams]:
    mixes = []
    for temperature in (0.0, 1.0, 0.7, 1.3):
        for top_p in (1.0, 0.95, 0.5, 0.05):
            for top_k in (0, 40):
                mixes.append(_p(temperature=temperature, top_p=top_p, top_k=top_k, top_logprobs=2))
    mixes.append(_p(temperature=1.0, frequency_penalty=0.5, presence_penalty=0.3))
    return mixes


def _distributions(vocab: int) -> list[np.ndarray]:
    """Flat, peaked and heavy-tailed logits, one with ties and -inf (a bias that rules tokens out)."""
    rng = np.random.default_rng(vocab)
    out = [(rng.standard_normal(vocab) * scale).astype(np.float32) for scale in (0.3, 2.0, 8.0)]
    out.append((rng.standard_cauchy(vocab) * 0.5).astype(np.float32))
    ties = np.round(rng.standard_normal(vocab) * 2).astype(np.float32)
    ties[rng.integers(0, vocab, vocab // 10)] = -np.inf
    out.append(ties)
    return out


def test_fast_path_draws_what_the_reference_drew() -> None:
    counts = {3: 2, 17: 1, 101: 5}
    for vocab in (V, 201_088, 1000):
        for logits in _distributions(vocab):
            for params in _mixes():
                for index in range(3):
                    seeded = dataclasses.replace(params, seed=7 * index + vocab)
                    got = sample(logits, seeded, index, counts=counts)
                    want = reference_sampling.sample(logits, seeded, index, counts=counts)
                    assert got == want, (vocab, seeded, index)


def test_fast_path_matches_reference_under_masks() -> None:
    logits = _logits(4, 3.0)
    rng = np.random.default_rng(4)
    few = np.sort(rng.choice(V, 50, replace=False))
    many = np.sort(rng.choice(V, V // 2, replace=False))
    for allowed in (few, many):
        for params in _mixes():
            got = sample(logits, params, 5, allowed)
            assert got == reference_sampling.sample(logits, params, 5, allowed)


def test_a_whole_vocabulary_mask_draws_what_the_reference_drew() -> None:
    """A mask that rules out a few ids of a 201k vocabulary (as a Harmony body's does), the best token kept
    or ruled out, as ids and as a bitmask: the shortcut at temperature 1 draws what the reference drew."""
    vocab = 201_088
    rng = np.random.default_rng(11)
    for logits in _distributions(vocab):
        best = int(np.argmax(logits))
        for rules_out_best in (False, True):
            banned = rng.choice(vocab, 20, replace=False)
            banned = np.append(banned, best) if rules_out_best else banned[banned != best]
            keep = np.ones(vocab, dtype=bool)
            keep[banned] = False
            ids = np.flatnonzero(keep)
            words = np.packbits(np.append(keep, np.zeros(-vocab % 32, dtype=bool)), bitorder="little").view("<u4")
            for allowed in (ids, TokenBitmask(words)):
                for params in _mixes():
                    for index in range(2):
                        seeded = dataclasses.replace(params, seed=13 * index + 5)
                        got = sample(logits, seeded, index, allowed)
                        assert got == reference_sampling.sample(logits, seeded, index, allowed), (seeded, index)


def test_skipping_the_logprob_never_changes_the_token() -> None:
    """The server asks for the sampled token's logprob only when the request does (SamplingParams.logprobs):
    without it the same token is drawn, greedy or not, masked, penalized or compacted, and none is reported;
    top_logprobs still brings both."""
    logits = _logits(3)
    wide = np.flatnonzero(np.arange(V) % 3 != 0)  # a whole-vocabulary mask that keeps most ids
    best = int(np.argmax(logits))
    narrow = np.array([best, 7, 99, 1234])  # few ids: sampled over the subset alone
    grid = [
        {"temperature": 0.0},
        {"temperature": 1.0},
        {"temperature": 0.7},
        {"temperature": 1.0, "top_p": 0.9},
        {"temperature": 1.0, "top_k": 20},
        {"temperature": 0.0, "presence_penalty": 1.5, "frequency_penalty": 0.5},
        {"temperature": 1.0, "presence_penalty": 1.5},
    ]
    for kw in grid:
        for allowed in (None, wide, narrow, np.array([i for i in wide if i != best])):
            for index in range(8):
                counts = {best: 2, 5: 1}
                args = (logits, _p(seed=11, **kw), index, allowed, counts)
                full = sample(*args)
                lean = sample(logits, _p(seed=11, logprobs=False, **kw), index, allowed, counts)
                assert lean.token_id == full.token_id, (kw, index)
                assert lean.logprob is None and full.logprob is not None
    with_top = sample(logits, _p(temperature=0.0, logprobs=False, top_logprobs=2), 0)
    assert with_top.logprob is not None and len(with_top.top_logprobs) == 2


def test_a_compact_head_draws_over_its_ids_what_the_whole_vocabulary_draws() -> None:
    """A compact head (every id outside `support` at UNSEEN_LOGIT): drawing over the support alone gives the
    whole vocabulary's token and logprobs, under every mask kind and with penalties; a mask that allows only
    ids outside the support, or top_logprobs past its size, take the whole vocabulary (the same draw too)."""
    from service.engine.compact import UNSEEN_LOGIT

    vocab = 201_088
    rng = np.random.default_rng(21)
    support = np.sort(rng.choice(vocab, 2048, replace=False))
    outside = np.setdiff1d(np.arange(vocab), support)
    keep = np.ones(vocab, dtype=bool)
    keep[rng.choice(vocab, 300, replace=False)] = False
    keep[support[:5]] = False
    words = np.packbits(np.append(keep, np.zeros(-vocab % 32, dtype=bool)), bitorder="little").view("<u4")
    masks = [None, np.flatnonzero(keep), TokenBitmask(words), support[::40], outside[:5000], outside[:3]]
    for scale in (0.5, 4.0):
        logits = np.full(vocab, UNSEEN_LOGIT, dtype=np.float32)
        logits[support] = rng.standard_normal(support.size).astype(np.float32) * scale
        for allowed in masks:
            for params in _mixes()[::3]:
                for index in range(2):
                    seeded = dataclasses.replace(params, seed=index + 3)
                    counts = {int(support[0]): 2, int(outside[0]): 1}
                    got = sample(logits, seeded, index, allowed, counts, support=support)
                    want = sample(logits, seeded, index, allowed, counts)
                    assert got.token_id == want.token_id, (scale, seeded, index)
                    assert (got.logprob is None) == (want.logprob is None)
                    if got.logprob is not None and want.logprob is not None:
                        assert abs(got.logprob - want.logprob) < 1e-5
                    assert [i for i, _ in got.top_logprobs] == [i for i, _ in want.top_logprobs]
    tiny = support[:2]
    logits = np.full(vocab, UNSEEN_LOGIT, dtype=np.float32)
    logits[tiny] = (1.0, 2.0)
    wide = sample(logits, _p(temperature=0.0, top_logprobs=5), 0, support=tiny)
    assert wide == sample(logits, _p(temperature=0.0, top_logprobs=5), 0) and len(wide.top_logprobs) == 5
