"""Reasoning summaries: a deterministic extract of the reasoning, emitted as OpenAI's summary events."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from service.projection import project
from service.prompting.base import ItemDelta, ItemEnded, ItemStarted
from service.protocol import initial_response, parse_create_request
from service.reasoning_summary import summarize, summary_level
from service.stream_builder import StreamBuilder
from tests.api_helpers import assert_well_formed_stream, client_for, raw_events
from tests.conftest import ServerProcess
from tests.test_conformance import assert_event_conforms, assert_response_conforms

REASONING = "The user wants a greeting.  I should answer briefly! Then stop? Nothing else matters here. Done."


def _events(summary: str | None) -> list[dict[str, Any]]:
    request = parse_create_request({"input": "hi"})
    response = initial_response(request, response_id="resp_sum", model="m", created_at=1, max_output_tokens=10)
    response["reasoning"] = {"effort": None, "summary": summary}
    builder = StreamBuilder(response)
    events = builder.created() + builder.in_progress()
    events += builder.feed([ItemStarted("reasoning"), ItemDelta(REASONING[:20])])
    events += builder.feed([ItemDelta(REASONING[20:]), ItemEnded()])
    events += builder.feed([ItemStarted("message"), ItemDelta("Hello")])
    events += builder.finish("stop", input_tokens=5, output_tokens=9, completed_at=2)
    return events


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        ("concise", "The user wants a greeting."),
        ("detailed", "The user wants a greeting. I should answer briefly! Then stop?"),
        ("auto", "The user wants a greeting. I should answer briefly! Then stop?"),
    ],
)
def test_summary_is_the_first_sentences_of_the_reasoning(level: str, expected: str) -> None:
    assert summarize(REASONING, level) == expected


def test_a_long_sentence_is_cut_at_a_word_boundary() -> None:
    text = "word " * 100
    summary = summarize(text, "concise")
    assert len(summary) <= 200 and summary.endswith("…") and summary[:-1].split() == ["word"] * 39
    assert summarize("   ", "auto") == ""


def test_level_from_summary_or_the_deprecated_generate_summary() -> None:
    assert summary_level({"summary": "concise"}) == "concise"
    assert summary_level({"summary": None, "generate_summary": "detailed"}) == "detailed"
    assert summary_level({"effort": "low", "summary": None}) is None
    assert summary_level(None) is None


def test_summary_events_close_the_reasoning_item_and_conform() -> None:
    events = _events("auto")
    types = [e["type"] for e in events]
    start = types.index("response.reasoning_text.done")
    assert types[start : start + 6] == [
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for event in events:
        assert_event_conforms(json.dumps(event))
    final = events[-1]["response"]
    expected = [{"type": "summary_text", "text": summarize(REASONING, "auto")}]
    assert final["output"][0]["summary"] == expected
    # A GET folds the log to the same item, also part way (before output_item.done).
    assert project(events)["output"] == final["output"]
    cut = types.index("response.reasoning_summary_text.done")
    assert project(events[:cut])["output"][0]["summary"] == expected
    assert _events("auto") == events  # deterministic: replay regenerates the same events


def test_no_summary_unless_asked() -> None:
    events = _events(None)
    assert not any("summary" in e["type"] for e in events)
    assert events[-1]["response"]["output"][0]["summary"] == []


def test_summaries_through_the_server(app_factory: Any, database_url: str) -> None:
    """The official client asks for `reasoning.summary`: the reasoning item carries the extract, streamed live
    as OpenAI's events, stored, and replayed from the log byte for byte."""
    # A short reasoning budget: the random model's analysis is cut after a few tokens and the answer follows.
    server: ServerProcess = app_factory(database_url, SERVICE_REASONING_TOKENS_LOW="12").start()
    client = client_for(server.url)
    ask: Any = {"model": "random-harmony-tiny", "input": "think", "max_output_tokens": 20, "temperature": 2}
    ask["reasoning"] = {"effort": "low", "summary": "detailed"}
    # Random weights: the first seed (seeded, so repeatable) whose output starts with reasoning that has text.
    seed = next(
        seed
        for seed in range(40)
        if (out := client.responses.create(**ask, extra_body={"seed": seed}).output)
        and out[0].type == "reasoning"
        and out[0].content
        and out[0].content[0].text.strip()
    )
    with client.responses.stream(**ask, extra_body={"seed": seed}) as stream:
        live = [event.model_dump(mode="json", exclude_unset=True) for event in stream]
    response_id = live[0]["response"]["id"]
    replayed = raw_events(server.url, response_id)
    assert_well_formed_stream(replayed)
    assert [e["type"] for e in replayed] == [e["type"] for e in live]
    for event in replayed:
        assert_event_conforms(json.dumps(event))
    reasoning = [e["item"] for e in replayed if e["type"] == "response.output_item.done"][0]
    assert reasoning["type"] == "reasoning", reasoning
    expected = summarize(reasoning["content"][0]["text"], "detailed")
    assert expected and reasoning["summary"] == [{"type": "summary_text", "text": expected}]
    deltas = [e["delta"] for e in live if e["type"] == "response.reasoning_summary_text.delta"]
    assert deltas == [expected]
    stored = assert_response_conforms(httpx.get(f"{server.url}/v1/responses/{response_id}", timeout=30).text)
    assert stored["reasoning"]["summary"] == "detailed"
    assert stored["output"][0]["summary"] == reasoning["summary"]
