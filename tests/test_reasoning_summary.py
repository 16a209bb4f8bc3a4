"""Reasoning summaries: a deterministic extract of the reasoning, emitted as OpenAI's summary events."""

from __future__ import annotations

import json
from typing import Any

import pytest

from service.projection import project
from service.prompting.base import ItemDelta, ItemEnded, ItemStarted
from service.protocol import initial_response, parse_create_request
from service.reasoning_summary import summarize, summary_level
from service.stream_builder import StreamBuilder
from tests.test_conformance import assert_event_conforms

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
