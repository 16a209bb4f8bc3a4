"""Tokenizing untrusted text in bounded native calls (issue 37, item 5): a long run of one character costs
linear time, the ids still decode to the text, and ordinary prompts render token for token as harmony does."""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Any

import httpx
import pytest

from service.prompting.base import PromptRequest
from service.prompting.bounded_encode import MAX_PIECE_CHARS, pieces
from service.prompting.harmony import HarmonyFormat
from service.prompting.harmony_tools import tool_message, tool_result_tokens


@pytest.fixture(scope="module")
def fmt() -> HarmonyFormat:
    return HarmonyFormat()


def _raw(fmt: HarmonyFormat, text: str) -> list[int]:
    return list(fmt.encoding.encode(text, disallowed_special=()))


WORDS = ["the", "quick", "brown", "fox", "Hello", "naïve", "café", "中文", "日本語", "한국어", "e\u0301", "½", "12345"]
SEPARATORS = [" ", " ", " ", "\n", ", ", "。", "", "\n\n", "  ", "\t", " - ", "/", "'s "]
ODD = list("'\"\\/<>|{}[]()!?.;:😀👍🏽\u00a0\u3000\r") + ["<|start|>", "<|end|>", "http://x.y/z?q=1", "  \n", "\r\n"]


def _natural_text(rng: random.Random, length: int) -> str:
    parts: list[str] = []
    size = 0
    while size < length:
        r = rng.random()
        part = rng.choice(WORDS) + rng.choice(SEPARATORS) if r < 0.75 else rng.choice(ODD) * rng.randint(1, 30)
        parts.append(part)
        size += len(part)
    return "".join(parts)


def test_ordinary_text_encodes_to_the_same_ids(fmt: HarmonyFormat) -> None:
    rng = random.Random(37)
    for length in (10, 900, 1_100, 5_000, 40_000) * 8:
        text = _natural_text(rng, length)
        assert fmt.encode_text(text) == _raw(fmt, text), text[:200]


@pytest.mark.parametrize(
    "run",
    ["a" * 400_000, "ab" * 200_000, " " * 400_000, "\n" * 400_000, "😀" * 100_000, "7" * 400_000, "é" * 200_000],
    ids=["a", "ab", "spaces", "newlines", "emoji", "digits", "accent"],
)
def test_a_long_run_encodes_in_linear_time_and_round_trips(fmt: HarmonyFormat, run: str) -> None:
    # The raw tokenizer took 21 s for 120 KB of one character (quadratic); 400 KB in pieces takes about 1 s.
    started = time.monotonic()
    ids = fmt.encode_text(run)
    assert time.monotonic() - started < 20
    assert fmt.encoding.decode_utf8(ids) == run
    assert all(len(piece) <= MAX_PIECE_CHARS for piece in pieces(run))


def test_pieces_cover_the_text_and_are_deterministic() -> None:
    text = _natural_text(random.Random(1), 50_000) + "x" * 5_000 + _natural_text(random.Random(2), 3_000)
    first = list(pieces(text))
    assert "".join(first) == text
    assert first == list(pieces(text))


def _function_tool(rng: random.Random, i: int) -> dict[str, Any]:
    long = _natural_text(rng, rng.choice([10, 80, 300])).replace("\r", "")
    return {
        "type": "function",
        "name": f"tool_{i}",
        "description": f"Does thing {i}.\n{long}\nSecond line with \"quotes\" and a \\ backslash",
        "parameters": {
            "type": "object",
            "description": long,
            "properties": {
                "city": {"type": "string", "description": long, "examples": [long[:100], "Paris"]},
                "unit": {"type": "string", "enum": ["celsius", long[:90] or "x"], "default": "celsius"},
                "days": {"type": "integer", "description": "How many days", "default": 3},
                "nested": {
                    "type": "object",
                    "properties": {long[:70].strip() or "k": {"type": "array", "items": {"type": "number"}}},
                    "required": [long[:70].strip() or "k"],
                },
                "either": {
                    "description": long[:120],
                    "oneOf": [{"type": "string", "description": long[:120]}, {"type": "number", "nullable": True}],
                },
            },
            "required": ["city"],
        },
    }


def _random_request(rng: random.Random) -> PromptRequest:
    items: list[dict[str, Any]] = []
    for turn in range(rng.randint(1, 4)):
        items.append({"role": "user", "content": _natural_text(rng, rng.choice([5, 200, 3_000]))})
        if rng.random() < 0.5:
            reasoning = [{"type": "reasoning_text", "text": _natural_text(rng, 300)}]
            items.append({"type": "reasoning", "content": reasoning})
        if rng.random() < 0.5:
            call_id = f"call_{turn}"
            items.append({"type": "function_call", "call_id": call_id, "name": "tool_0", "arguments": '{"city":"x"}'})
            items.append({"type": "function_call_output", "call_id": call_id, "output": _natural_text(rng, 2_000)})
        answer = [{"type": "output_text", "text": _natural_text(rng, 500)}]
        items.append({"type": "message", "role": "assistant", "content": answer})
    items.append({"role": "user", "content": [{"type": "input_text", "text": _natural_text(rng, 1_500)}]})
    tools = tuple(_function_tool(rng, i) for i in range(rng.randint(0, 3)))
    if rng.random() < 0.3:
        tools += ({"type": "custom", "name": "raw", "description": _natural_text(rng, 100)},)
    if rng.random() < 0.3:
        tools += (
            {
                "type": "mcp_function",
                "namespace": "docs",
                "server_description": _natural_text(rng, 150),
                "name": "search",
                "description": _natural_text(rng, 120),
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        )
    if rng.random() < 0.2:
        tools += ({"type": "python"},)
    response_format = None
    if rng.random() < 0.3:
        schema = {"type": "object", "properties": {"answer": {"type": "string", "description": _natural_text(rng, 90)}}}
        response_format = {"type": "json_schema", "name": "out", "schema": schema}
    return PromptRequest(
        items=items,
        instructions=_natural_text(rng, rng.choice([20, 400, 6_000])) if rng.random() < 0.8 else None,
        tools=tools,
        reasoning_effort=rng.choice(["low", "medium", "high"]),
        response_format=response_format,
    )


def test_prompts_render_token_for_token_as_harmony_does(fmt: HarmonyFormat) -> None:
    rng = random.Random(5)
    for _ in range(60):
        request = _random_request(rng)
        assert fmt.render(request) == fmt.render_natively(request), json.dumps(request.items)[:300]


def test_a_huge_run_in_any_field_renders_quickly_and_decodes_to_it(fmt: HarmonyFormat) -> None:
    run = "a" * 300_000
    tool = {"type": "function", "name": "f", "description": run, "parameters": {"type": "object", "properties": {}}}
    request = PromptRequest(
        items=[
            {"role": "user", "content": run},
            {"type": "function_call", "call_id": "c", "name": "f" + run, "arguments": run},
            {"type": "function_call_output", "call_id": "c", "output": run},
        ],
        instructions=run,
        tools=(tool,),
    )
    started = time.monotonic()
    ids = fmt.render(request)
    assert time.monotonic() - started < 30  # natively: hours
    text = fmt.encoding.decode_utf8(ids)
    # instructions, description, user text, the call's recipient and arguments, the output's author and text
    assert text.count(run) == 7
    assert ids == fmt.render(request)  # deterministic: a resumed run rebuilds the same prompt


def test_a_tool_result_is_tokenized_in_bounded_calls(fmt: HarmonyFormat) -> None:
    ordinary = _natural_text(random.Random(9), 20_000)
    native = list(fmt.encoding.render(tool_message("docs.search", ordinary)))
    assert tool_result_tokens(fmt.encoding, "docs.search", ordinary)[: len(native)] == native

    run = "b" * 1_000_000
    done = threading.Event()
    ticks: list[float] = []

    def tokenize() -> None:
        tool_result_tokens(fmt.encoding, "docs.search", run)
        done.set()

    worker = threading.Thread(target=tokenize)
    worker.start()
    # Another thread keeps getting the GIL while the megabyte is tokenized (one native call held it for hours).
    while not done.is_set():
        before = time.monotonic()
        time.sleep(0.001)
        ticks.append(time.monotonic() - before)
    worker.join()
    assert max(ticks) < 0.5, max(ticks)
    assert run in fmt.encoding.decode_utf8(tool_result_tokens(fmt.encoding, "python", run))


def test_health_answers_while_a_4_mb_run_is_tokenized(database_url: str, server_factory: Any) -> None:
    """Through the real server: a body of 4 MB of one character (the most a body may hold) is tokenized while
    other requests are served; natively its one tokenizer call held the GIL, and so the server, for hours."""
    server = server_factory(database_url).start()
    # Start-up builds the grammar tokenizer in the background (a second or two holding the GIL): a structured
    # request waits for it, so that what is measured below is the long request alone.
    json_format = {"type": "json_schema", "name": "x", "schema": {"type": "object"}}
    warm_body = {"input": "hi", "max_output_tokens": 2, "text": {"format": json_format}}
    warm = httpx.post(server.url + "/v1/responses", json=warm_body, timeout=60)
    assert warm.status_code == 200, warm.text
    text = {"type": "input_text", "text": "a" * (4 * 1024 * 1024 - 200)}
    body = {"input": [{"role": "user", "content": [text]}], "max_output_tokens": 4}
    outcome: dict[str, httpx.Response] = {}

    def post() -> None:
        with httpx.Client(timeout=300) as http:
            outcome["response"] = http.post(server.url + "/v1/responses", json=body)

    poster = threading.Thread(target=post)
    poster.start()
    waits: list[float] = []
    with httpx.Client(base_url=server.url, timeout=30) as http:
        while poster.is_alive():
            started = time.monotonic()
            assert http.get("/health").status_code == 200
            waits.append(time.monotonic() - started)
            time.sleep(0.05)
    poster.join()
    response = outcome["response"]
    assert len(waits) >= 5, "the request was over before it could be observed"
    # Held for the whole call, the GIL stopped the server for hours; a loaded 2-core machine (four workers and
    # their servers) has delayed one /health by 2.2 s while the rest took 40-230 ms.
    assert max(waits) < 5.0, sorted(waits)[-5:]
    # It cannot fit the model's context: refused as any too-long prompt is.
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "context_length_exceeded"
