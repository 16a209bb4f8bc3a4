"""The prefix cache: LRU in bytes, longest-prefix lookup, and not one sampled token changed by it."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest

from service.engine.base import SamplingParams
from service.engine.onnx_engine import OnnxEngine
from service.engine.prefix_cache import PrefixCache
from service.runs import warming
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


def _conversation(
    engine: OnnxEngine, turns: int, *, neighbour: bool, warm_chunk: int = 0
) -> list[list[tuple[int, float | None]]]:
    """Turn k's prompt is turn k-1's prompt and output plus new tokens; (token, logprob) per turn. With
    `warm_chunk`, the engine prefills each next turn's start between turns, as an idle server's does."""
    history: list[int] = []
    outputs = []
    for turn in range(turns):
        ids = history + prompt(5 + turn, start=11 * turn + 1)
        params = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.95, seed=turn, top_logprobs=2)
        engine.add_sequence(f"t{turn}", ids, params)
        if neighbour:  # another sequence in the same batch, with a prompt of its own
            engine.add_sequence(f"n{turn}", prompt(7, start=turn + 2), SamplingParams(max_new_tokens=6, seed=9))
        out: list[tuple[int, float | None]] = []
        while engine.active_sequence_ids():
            step = engine.step()
            if f"t{turn}" in step:
                token = step[f"t{turn}"]
                out.append((token.token_id, token.logprob))
        outputs.append(out)
        history = ids + [token for token, _ in out]
        if warm_chunk:
            engine.warm_prefix(history)
            while engine.warm(warm_chunk):
                pass
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


@pytest.mark.parametrize("warm_chunk", [5, 64])
@pytest.mark.parametrize("threads", [1, 2])
def test_warming_the_next_turn_changes_no_token(contrib_int8_dir: Path, threads: int, warm_chunk: int) -> None:
    """An idle engine prefills each next turn's start (here: the last prompt and every sampled token):
    the next turn reuses all of it and samples what a cold engine samples."""
    cold = OnnxEngine(contrib_int8_dir, intra_op_threads=threads)
    warm = OnnxEngine(contrib_int8_dir, intra_op_threads=threads, prefix_cache_bytes=64 << 20)
    outputs = _conversation(warm, 4, neighbour=False, warm_chunk=warm_chunk)
    assert outputs == _conversation(cold, 4, neighbour=False)
    cache = warm.prefix_cache
    assert cache is not None and cache.hits == 3  # warming's own reuse is not a run's hit
    news = [5 + turn for turn in range(4)]  # each turn's new tokens, as _conversation makes them
    histories = [sum(news[: k + 1]) + sum(len(out) for out in outputs[: k + 1]) for k in range(3)]
    assert cache.reused_tokens == sum(histories)  # turn k+1 prefilled only its new tokens
    # Warming computed each history past what the cache held: the sampled tokens (turn k's prompt was
    # cached by its own prefill).
    assert cache.warmed_tokens == sum(len(out) for out in outputs[:4])


def test_a_newcomer_ends_the_warming_and_keeps_what_it_did(contrib_int8_dir: Path) -> None:
    engine = OnnxEngine(contrib_int8_dir, intra_op_threads=1, prefix_cache_bytes=64 << 20)
    engine.add_sequence("a", prompt(6), SamplingParams(max_new_tokens=20, temperature=1.0, seed=5))
    tokens = []
    while engine.active_sequence_ids():
        tokens.append(engine.step()["a"].token_id)
    engine.warm_prefix(prompt(6) + tokens)
    engine.warm_prefix(prompt(9, start=50))
    assert engine.warm(4)  # the prompt's 6 rows copied from the cache, 4 more prefilled; more to do
    engine.add_sequence("b", prompt(6) + tokens + prompt(3, start=40), SamplingParams(max_new_tokens=2, seed=1))
    cache = engine.prefix_cache
    assert cache is not None and cache.reused_tokens == 6 + 4 and cache.warmed_tokens == 4
    assert not engine.warm(64)  # busy: the rest, and the other queued prompt, are dropped
    while engine.active_sequence_ids():
        engine.step()
    assert not engine.warm(64) and cache.warmed_tokens == 4


def test_a_newcomer_takes_over_the_warming_sequence_and_samples_what_a_cold_engine_does(
    contrib_int8_dir: Path,
) -> None:
    """The next turn arriving while its start is being warmed takes the warming sequence's slot, rows and all (no
    copy through the cache), prefills the rest, and samples exactly what a cold engine samples."""
    engine = OnnxEngine(contrib_int8_dir, intra_op_threads=1, prefix_cache_bytes=64 << 20)
    engine.add_sequence("a", prompt(6), SamplingParams(max_new_tokens=20, temperature=1.0, seed=5))
    tokens = []
    while engine.active_sequence_ids():
        tokens.append(engine.step()["a"].token_id)
    history = prompt(6) + tokens
    engine.warm_prefix(history)
    assert engine.warm(4)  # the first turn's prompt from the cache, 4 more rows prefilled, more to do
    warming = engine._warming
    assert warming is not None and warming.prefilled == 6 + 4
    slot = warming.slot
    params = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=0.95, seed=3, top_logprobs=2)
    next_turn = history + prompt(3, start=40)
    engine.add_sequence("b", next_turn, params)
    taken = engine._seqs["b"]
    assert engine._warming is None and taken.slot == slot and taken.length == 10, "the warmed rows stay in place"
    cache = engine.prefix_cache
    assert cache is not None and cache.reused_tokens == 10  # a run's reuse (warming's own is not counted)
    assert cache.match(next_turn)[0] == 6, "the warmed rows were not copied into the cache (only turn 1's prompt)"
    cold = OnnxEngine(contrib_int8_dir, intra_op_threads=1)
    cold.add_sequence("b", next_turn, params)

    def sampled(eng: OnnxEngine) -> list[tuple[int, float | None, tuple[tuple[int, float], ...]]]:
        out = []
        while eng.active_sequence_ids():
            token = eng.step()["b"]
            out.append((token.token_id, token.logprob, token.top_logprobs))
        return out

    assert sampled(engine) == sampled(cold)
    # Its rows, the warmed ones included, go to the cache when it ends.
    assert cache.match(next_turn)[0] >= len(next_turn) - 1


def _turn_warmed_as_it_decodes(
    engine: OnnxEngine, ids: list[int], seq_id: str, *, every: int
) -> list[tuple[int, float | None]]:
    """Decode one turn; every `every` tokens hand the engine the history so far (less the last token, as a
    partial render leaves the unstable tail out) and warm a few tokens of it beside the decoding; then warm
    the whole finished turn."""
    params = SamplingParams(max_new_tokens=20, temperature=1.0, top_p=0.95, seed=len(ids), top_logprobs=2)
    engine.add_sequence(seq_id, ids, params)
    out: list[tuple[int, float | None]] = []
    while engine.active_sequence_ids():
        token = engine.step()[seq_id]
        out.append((token.token_id, token.logprob))
        if len(out) % every == 0 and token.finish_reason is None:
            engine.warm_prefix(ids + [t for t, _ in out[:-1]])
        engine.warm(3)
    engine.warm_prefix(ids + [t for t, _ in out])  # the finished turn, as the server warms it
    while engine.warm(3):
        pass
    return out


def test_warming_beside_decoding_changes_no_token_and_copies_the_live_prompt(contrib_int8_dir: Path) -> None:
    """A continued conversation's next turn is warmed while its current turn decodes: the rows its prompt
    prefilled are copied from its slot (not prefilled again), no sampled token or logprob changes, and the
    next turn then prefills only what it adds."""
    cold = OnnxEngine(contrib_int8_dir, intra_op_threads=1)
    warm = OnnxEngine(contrib_int8_dir, intra_op_threads=1, prefix_cache_bytes=64 << 20)
    first = prompt(9)
    turns = []
    for engine in (cold, warm):
        one = _turn_warmed_as_it_decodes(engine, first, "a", every=4)
        second = first + [t for t, _ in one] + prompt(5, start=40)
        two = _turn_warmed_as_it_decodes(engine, second, "b", every=4)
        third = second + [t for t, _ in two] + prompt(6, start=70)
        engine.add_sequence("c", third, SamplingParams(max_new_tokens=4, seed=2))
        three = []
        while engine.active_sequence_ids():
            three.append(engine.step()["c"].token_id)
        turns.append((one, two, three))
    assert turns[0] == turns[1]
    cache = warm.prefix_cache
    assert cache is not None
    # Each turn's warming prefilled its sampled tokens and nothing else: its prompt's rows were copied from
    # its slot (turn a) or the cache, and each render extended the one before.
    assert cache.warmed_tokens == len(turns[1][0]) + len(turns[1][1])
    # Turns b and c prefilled only their new tokens.
    assert cache.hits == 2 and cache.reused_tokens == (len(second) - 5) + (len(third) - 6)


def test_warming_waits_while_a_newcomer_prefills(contrib_int8_dir: Path) -> None:
    engine = OnnxEngine(contrib_int8_dir, intra_op_threads=1, prefix_cache_bytes=64 << 20)
    engine.add_sequence("a", prompt(6), SamplingParams(max_new_tokens=8, seed=5))
    engine.step()  # "a" is prefilled and decoding
    engine.warm_prefix(prompt(6) + prompt(4, start=30))
    engine.prefill_tokens = 2  # "b" needs several steps
    engine.add_sequence("b", prompt(12, start=50), SamplingParams(max_new_tokens=2, seed=1))
    engine.warm_prefix(prompt(6) + prompt(4, start=30))  # given again after the newcomer dropped the queue
    engine.step()
    cache = engine.prefix_cache
    assert cache is not None and engine.prefilling_sequence_ids() == ["b"]
    assert engine.warm(64) and cache.warmed_tokens == 0  # work left, none done while "b" prefills
    while engine.prefilling_sequence_ids():
        engine.step()
    assert not engine.warm(64) and cache.warmed_tokens == 4  # beside "a" and "b": the 6 rows came from "a"'s slot


def test_a_longer_render_retargets_the_warming_and_another_prompt_waits(contrib_int8_dir: Path) -> None:
    engine = OnnxEngine(contrib_int8_dir, intra_op_threads=1, prefix_cache_bytes=64 << 20)
    cache = engine.prefix_cache
    assert cache is not None
    a, b = prompt(40), prompt(10, start=60)
    engine.warm_prefix(a[:30])
    assert engine.warm(4) and cache.warmed_tokens == 4
    engine.warm_prefix(a[:20])  # older than what is being warmed: nothing to do
    engine.warm_prefix(a)  # extends it: the same sequence goes on to 40 tokens
    assert not engine.warm(64) and cache.warmed_tokens == 40
    assert len(cache) == 1 and cache.match(a)[0] == 40  # cached once the idle engine had nothing left
    engine.warm_prefix(b + [1, 2])  # unrelated to the next one: it is finished first
    engine.warm_prefix(a + [7, 8, 9])
    assert engine.warm(6) and cache.warmed_tokens == 40 + 6
    assert not engine.warm(64) and cache.warmed_tokens == 40 + 12 + 3  # b whole; a: 40 rows copied, 3 prefilled
    assert cache.match(b + [1, 2])[0] == 12 and cache.match(a + [7, 8, 9])[0] == 43


def test_engines_without_a_cache_ignore_warming(small_int8_dir: Path) -> None:
    engine = OnnxEngine(small_int8_dir, intra_op_threads=1, prefix_cache_bytes=1 << 20)
    engine.warm_prefix(prompt(9))
    assert not engine.warm(64)


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


def _metric(url: str, name: str) -> float:
    lines = [line for line in httpx.get(url + "/metrics").text.splitlines() if line.startswith(name + " ")]
    return float(lines[0].split()[-1])


def test_conversation_through_the_server_is_the_same_with_and_without_the_cache(
    database_url: str, app_factory: Callable[..., ServerProcess]
) -> None:
    """Each turn of a conversation through the real server: the same with and without the cache; with it,
    each turn prefills only its new message. The first turn's next turn is warmed once the engine idles (the
    test waits for that); the second, a continued conversation, is warmed as it decodes (warm_while_decoding),
    so the third turn follows at once."""
    texts = []
    for cache_bytes in ("0", str(64 << 20)):
        # One database, two servers in turn (one conversation each): on SQLite and on PostgreSQL.
        server = app_factory(
            database_url, SERVICE_PREFIX_CACHE_BYTES=cache_bytes, SERVICE_WARM_WHILE_DECODING="1"
        ).start()
        client = client_for(server.url)
        previous = None
        turns = []
        reused_before = warmed_before = 0.0
        for turn in range(3):
            if turn == 1 and cache_bytes != "0":
                deadline = time.monotonic() + 60
                while _metric(server.url, "service_prefix_cache_warmed_tokens") <= warmed_before:
                    assert time.monotonic() < deadline, "the idle engine never warmed the next turn"
                    time.sleep(0.05)  # one warming call covers this turn's answer (under 64 tokens)
            warmed_before = _metric(server.url, "service_prefix_cache_warmed_tokens")
            response = client.responses.create(
                input=f"turn {turn}: tell me more",
                max_output_tokens=80,
                previous_response_id=previous,
                extra_body={"seed": 7},
            )
            previous = response.id
            turns.append([{k: v for k, v in item.model_dump().items() if k != "id"} for item in response.output])
            reused = _metric(server.url, "service_prefix_cache_reused_tokens")
            assert response.usage is not None
            if cache_bytes == "0":
                assert reused == 0
            elif turn > 0:  # all but the new message's text and the few tokens around it
                assert reused - reused_before >= response.usage.input_tokens - 16, (reused, response.usage)
            reused_before = reused
        texts.append(turns)
        server.stop()
    assert texts[0] == texts[1]


def test_an_idle_engine_waits_before_it_warms_a_finished_runs_next_turn(
    database_url: str, app_factory: Callable[..., ServerProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client's next request often follows a response at once: the engine left idle by a run waits
    IDLE_WARM_DELAY_S before warming that run's next turn, so a newcomer meanwhile finds no warming chunk in its
    way (made long here, so that nothing is timed: nothing is warmed while it lasts)."""
    monkeypatch.setattr(warming, "IDLE_WARM_DELAY_S", 3600.0)
    server = app_factory(database_url, SERVICE_PREFIX_CACHE_BYTES=str(64 << 20)).start()
    client = client_for(server.url)
    first = client.responses.create(input="a first question", max_output_tokens=40, extra_body={"seed": 3})
    time.sleep(0.5)  # an idle engine would have warmed the first run's next turn by now, without the delay
    assert _metric(server.url, "service_prefix_cache_warmed_tokens") == 0
    second = client.responses.create(input="another question", max_output_tokens=8, extra_body={"seed": 4})
    assert first.status == second.status == "incomplete"  # the random model never stops: cut at the limit
    assert _metric(server.url, "service_prefix_cache_warmed_tokens") == 0
