"""The prefix cache: LRU in bytes, longest-prefix lookup, and not one sampled token changed by it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest

from service.engine.base import SamplingParams
from service.engine.onnx_engine import OnnxEngine
from service.engine.prefix_cache import PrefixCache
from tests.api_helpers import client_for
from tests.conftest import ServerProcess
from tests.engine_fixtures import contrib_int8_dir, prompt, small_int8_dir

__all__ = ["contrib_int8_dir", "small_int8_dir"]


def _rows(n: int, fill: float) -> list[np.ndarray]:
    return [np.full((2, n, 4), fill, dtype=np.float32)]  # 32 bytes per token


def test_longest_prefix_wins_and_lookup_refreshes_it() -> None:
    cache = PrefixCache(10_000)
    cache.put([1, 2, 3], _rows(3, 1.0))
    cache.put([1, 2, 9, 9], _rows(4, 2.0))
    assert cache.match([1, 2, 3, 4])[0] == 3
    length, entry = cache.match([1, 2, 9, 9, 5])
    assert length == 4 and entry is not None and float(entry.rows[0][0, 0, 0]) == 2.0
    assert cache.match([7, 1, 2]) == (0, None)


def test_bounded_in_bytes_least_recently_used_goes_first() -> None:
    per_entry = PrefixCache(0)
    cache = PrefixCache(3 * (10 * 32 + 10 * 8))  # three entries of 10 tokens fit
    for first in (1, 2, 3):
        cache.put([first] * 10, _rows(10, float(first)))
    cache.match([1] * 10)  # 1 is now the most recent; 2 the least
    cache.put([4] * 10, _rows(10, 4.0))
    assert cache.match([2] * 10) == (0, None)
    assert cache.match([1] * 10)[0] == 10 and cache.match([4] * 10)[0] == 10
    assert cache.bytes <= cache.max_bytes and len(cache) == 3
    per_entry.put([1], _rows(1, 1.0))  # larger than the whole budget: not kept
    assert len(per_entry) == 0


def test_a_longer_entry_supersedes_its_prefixes() -> None:
    cache = PrefixCache(10_000)
    cache.put([1, 2], _rows(2, 1.0))
    cache.put([1, 2, 3, 4], _rows(4, 1.0))
    assert len(cache) == 1


def _conversation(engine: OnnxEngine, turns: int, *, neighbour: bool) -> list[list[tuple[int, float]]]:
    """Turn k's prompt is turn k-1's prompt and output plus new tokens; (token, logprob) per turn."""
    history: list[int] = []
    outputs = []
    for turn in range(turns):
        ids = history + prompt(5 + turn, start=11 * turn + 1)
        params = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.95, seed=turn, top_logprobs=2)
        engine.add_sequence(f"t{turn}", ids, params)
        if neighbour:  # another sequence in the same batch, with a prompt of its own
            engine.add_sequence(f"n{turn}", prompt(7, start=turn + 2), SamplingParams(max_new_tokens=6, seed=9))
        out: list[tuple[int, float]] = []
        while engine.active_sequence_ids():
            step = engine.step()
            if f"t{turn}" in step:
                token = step[f"t{turn}"]
                out.append((token.token_id, token.logprob))
        outputs.append(out)
        history = ids + [token for token, _ in out]
    return outputs


@pytest.mark.parametrize("chunk", [None, 8])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("neighbour", [False, True])
def test_cache_does_not_change_a_single_token(
    contrib_int8_dir: Path, threads: int, neighbour: bool, chunk: int | None
) -> None:
    cold = OnnxEngine(contrib_int8_dir, intra_op_threads=threads)
    warm = OnnxEngine(contrib_int8_dir, intra_op_threads=threads, prefix_cache_bytes=64 << 20)
    if chunk is not None:  # long prompts prefill in chunks: reuse must keep the chunk boundaries
        cold._prefill_chunk = warm._prefill_chunk = chunk
    assert cold.prefix_cache is None and warm.prefix_cache is not None
    assert _conversation(warm, 5, neighbour=neighbour) == _conversation(cold, 5, neighbour=neighbour)
    # Turns 2..5 each reused at least the previous turn's prompt (what its prefill computed).
    assert warm.prefix_cache.hits >= 4 and warm.prefix_cache.reused_tokens >= 4 * 5


def test_resume_from_the_cache_is_exact(contrib_int8_dir: Path) -> None:
    """A run resumed (generated_ids) on an engine whose cache holds its prefix draws what it drew."""
    params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=3)
    full = OnnxEngine(contrib_int8_dir, intra_op_threads=1)
    full.add_sequence("a", prompt(9), params)
    tokens = []
    while full.active_sequence_ids():
        tokens.append(full.step()["a"].token_id)
    warm = OnnxEngine(contrib_int8_dir, intra_op_threads=1, prefix_cache_bytes=1 << 20)
    warm.add_sequence("p", prompt(9), SamplingParams(max_new_tokens=1, seed=0))  # caches the prompt's rows
    warm.step()
    warm.add_sequence("a", prompt(9), params, generated_ids=tokens[:6])
    rest = []
    while warm.active_sequence_ids():
        rest.append(warm.step()["a"].token_id)
    assert tokens[6:] == rest and warm.prefix_cache is not None and warm.prefix_cache.hits == 1


def test_standard_layout_has_no_prefix_cache(small_int8_dir: Path) -> None:
    """Dynamic int8 quantizes per call: a reused row would not be the row a fresh prefill makes."""
    assert OnnxEngine(small_int8_dir, intra_op_threads=1, prefix_cache_bytes=1 << 20).prefix_cache is None


def test_conversation_through_the_server_is_the_same_with_and_without_the_cache(
    tmp_path: Path, server_factory: Callable[..., ServerProcess]
) -> None:
    texts = []
    for cache_bytes in ("0", str(64 << 20)):
        url = f"sqlite+aiosqlite:///{tmp_path / f'cache-{cache_bytes}.db'}"
        server = server_factory(url, SERVICE_PREFIX_CACHE_BYTES=cache_bytes).start()
        client = client_for(server.url)
        previous = None
        turns = []
        for turn in range(3):
            response = client.responses.create(
                input=f"turn {turn}: tell me more",
                max_output_tokens=24,
                previous_response_id=previous,
                extra_body={"seed": 7},
            )
            previous = response.id
            turns.append([{k: v for k, v in item.model_dump().items() if k != "id"} for item in response.output])
        texts.append(turns)
        metrics = httpx.get(server.url + "/metrics").text
        hits = [line for line in metrics.splitlines() if line.startswith("service_prefix_cache_hits")]
        assert float(hits[0].split()[-1]) == 0 if cache_bytes == "0" else float(hits[0].split()[-1]) >= 2, hits
        server.stop()
    assert texts[0] == texts[1]
