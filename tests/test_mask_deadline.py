"""A slow grammar mask holds nobody: it sits its steps out, and past the deadline its sequence alone fails.

The constraints here are fakes whose masks sleep (on an Event the test releases, so no thread outlives it
by much); the others must draw exactly the tokens they draw alone, and never wait for the slow one longer
than the deadline."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from service.config import Settings
from service.engine.base import DEFAULT_MASK_DEADLINE_S, SamplingParams, TokenBitmask
from service.engine.onnx_engine import OnnxEngine
from service.models import load_runtime
from tests.engine_fixtures import SMALL, contrib_int8_dir, engine, prompt, run_to_end, small_int8_dir

__all__ = ["contrib_int8_dir", "engine", "small_int8_dir"]

PARAMS = SamplingParams(max_new_tokens=10, temperature=1.0, seed=3)


def _even() -> TokenBitmask:
    bits = np.zeros(-(-SMALL.vocab_size // 32) * 32, dtype=np.uint8)
    bits[: SMALL.vocab_size : 2] = 1
    return TokenBitmask(np.packbits(bits, bitorder="little").view("<u4").copy())


class _Grammar:
    """Even ids only. From its `slow_from`-th mask on, computing a mask blocks for `delay` seconds (or until
    `release` is set); `exhaust_after` tokens in, it reports its per-step fuel as spent."""

    def __init__(
        self, release: threading.Event, *, slow_from: int | None = None, delay: float = 0.0, exhaust_after: int = -1
    ) -> None:
        self.release, self.slow_from, self.delay, self.exhaust_after = release, slow_from, delay, exhaust_after
        self.fed: list[int] = []
        self.masks = 0
        self._memo: TokenBitmask | None = None

    def allowed_token_ids(self) -> TokenBitmask:
        if self._memo is None:
            self.masks += 1
            if self.slow_from is not None and self.masks >= self.slow_from:
                self.release.wait(self.delay)
            self._memo = _even()
        return self._memo

    def accept(self, token_id: int) -> None:
        self._memo = None
        self.fed.append(token_id)

    def failure(self) -> str | None:
        return "lexer fuel spent" if 0 <= self.exhaust_after <= len(self.fed) else None


@pytest.fixture
def release() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()  # the abandoned mask threads end now


def _alone(engine: OnnxEngine, release: threading.Event) -> list[int]:
    engine.add_sequence("alone", prompt(6), PARAMS, constraint=_Grammar(release))
    return run_to_end(engine)["alone"]


def _run(engine: OnnxEngine) -> tuple[dict[str, list[int]], dict[str, str], list[float]]:
    """Step to the end: tokens by sequence, failures by sequence, each step's wall time."""
    out: dict[str, list[int]] = {}
    failed: dict[str, str] = {}
    steps: list[float] = []
    for _ in range(1000):
        if not engine.active_sequence_ids():
            break
        started = time.perf_counter()
        for seq_id, token in engine.step().items():
            out.setdefault(seq_id, []).append(token.token_id)
        steps.append(time.perf_counter() - started)
        failed.update({seq_id: str(exc) for seq_id, exc in engine.pop_failures().items()})
    return out, failed, steps


def test_a_mask_past_its_deadline_fails_its_sequence_alone(engine: OnnxEngine, release: threading.Event) -> None:
    alone = _alone(engine, release)
    engine.mask_deadline_s = 0.3
    slow = _Grammar(release, slow_from=3, delay=30.0)
    engine.add_sequence("slow", prompt(5), PARAMS, constraint=slow)
    engine.add_sequence("fast", prompt(6), PARAMS, constraint=_Grammar(release))
    out, failed, steps = _run(engine)
    assert out["fast"] == alone, "the other sequence draws exactly what it draws alone"
    assert list(failed) == ["slow"] and "longer than 0.3 s" in failed["slow"]
    assert len(out["slow"]) == 2 and slow.fed == out["slow"], "it stopped at its slow mask"
    assert max(steps) < 5.0, "no step waited for the 30 s mask"
    assert "slow" not in engine.active_sequence_ids()


def test_a_slow_mask_sits_out_steps_without_holding_the_others(engine: OnnxEngine, release: threading.Event) -> None:
    alone = _alone(engine, release)
    engine.mask_deadline_s = 20.0
    # Every mask from the second on takes 0.15 s: the slow sequence goes on at that pace while the other finishes.
    slow = _Grammar(release, slow_from=2, delay=0.15)
    engine.add_sequence("slow", prompt(5), PARAMS, constraint=slow)
    engine.add_sequence("fast", prompt(6), PARAMS, constraint=_Grammar(release))
    out, failed, _ = _run(engine)
    assert not failed
    assert out["fast"] == alone and len(out["slow"]) == 10 and all(t % 2 == 0 for t in out["slow"])
    engine.add_sequence("slow-alone", prompt(5), PARAMS, constraint=_Grammar(release))
    assert run_to_end(engine)["slow-alone"] == out["slow"], "sitting steps out never changes a sampled token"


def test_the_fast_sequence_is_not_slowed_to_the_slow_masks_pace(engine: OnnxEngine, release: threading.Event) -> None:
    engine.mask_deadline_s = 20.0
    engine.add_sequence("slow", prompt(5), PARAMS, constraint=_Grammar(release, slow_from=2, delay=0.5))
    engine.add_sequence("fast", prompt(6), PARAMS, constraint=_Grammar(release))
    started = time.perf_counter()
    done_at = None
    for _ in range(1000):
        if "fast" not in engine.active_sequence_ids():
            done_at = time.perf_counter() - started
            break
        engine.step()
    assert done_at is not None and done_at < 2.5, f"10 tokens took {done_at} s beside 0.5 s masks (5 s if held)"
    release.set()
    run_to_end(engine)


def test_a_grammar_out_of_fuel_fails_its_sequence_alone(engine: OnnxEngine, release: threading.Event) -> None:
    alone = _alone(engine, release)
    engine.add_sequence("spent", prompt(5), PARAMS, constraint=_Grammar(release, exhaust_after=4))
    engine.add_sequence("fast", prompt(6), PARAMS, constraint=_Grammar(release))
    out, failed, _ = _run(engine)
    assert out["fast"] == alone and list(failed) == ["spent"] and "lexer fuel spent" in failed["spent"]
    assert len(out["spent"]) == 4


def test_the_deadline_is_a_setting(random_model_dir: Path) -> None:
    """SERVICE_MASK_DEADLINE_SECONDS reaches the engine the server loads (2 s when unset)."""
    for settings, deadline in [
        (Settings(model=random_model_dir), DEFAULT_MASK_DEADLINE_S),
        (Settings(model=random_model_dir, mask_deadline_seconds=0.25), 0.25),
    ]:
        loaded = load_runtime(settings).engine
        assert isinstance(loaded, OnnxEngine) and loaded.mask_deadline_s == deadline
    assert DEFAULT_MASK_DEADLINE_S == 2.0
