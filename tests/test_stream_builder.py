"""The stream builder (chunks -> events) and the projection (events -> Response) are pure."""

from __future__ import annotations

from typing import Any

import pytest

from service.projection import finished_output, project
from service.prompting.base import ItemDelta, ItemEnded, ItemStarted
from service.protocol import initial_response, parse_create_request
from service.stream_builder import StreamBuilder


def _builder() -> StreamBuilder:
    request = parse_create_request({"input": "hi"})
    return StreamBuilder(
        initial_response(request, response_id="resp_test", model="m", created_at=1, max_output_tokens=10)
    )


def _run(builder: StreamBuilder, ending: str = "stop") -> list[dict[str, Any]]:
    events = builder.created() + builder.in_progress()
    events += builder.feed([ItemStarted("reasoning"), ItemDelta("think")])
    events += builder.feed([ItemDelta("ing"), ItemEnded()])
    events += builder.feed(
        [ItemStarted("function_call", name="lookup"), ItemDelta('{"q":'), ItemDelta('"x"}'), ItemEnded()]
    )
    events += builder.feed([ItemStarted("message"), ItemDelta("Hel"), ItemDelta("lo")])
    events += builder.finish(ending, input_tokens=5, output_tokens=9, completed_at=2)  # type: ignore[arg-type]
    return events


def test_event_order_and_contiguous_sequence_numbers() -> None:
    events = _run(_builder())
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed",
    ]  # fmt: skip
    final = events[-1]["response"]
    assert final["status"] == "completed"
    assert [i["type"] for i in final["output"]] == ["reasoning", "function_call", "message"]
    assert final["output"][1]["arguments"] == '{"q":"x"}' and final["output"][1]["name"] == "lookup"
    assert final["output"][2]["content"][0]["text"] == "Hello"
    assert final["usage"]["total_tokens"] == 14


def test_same_input_same_events() -> None:
    assert _run(_builder()) == _run(_builder())


@pytest.mark.parametrize(("ending", "event_type", "status"), [
    ("length", "response.incomplete", "incomplete"),
    ("cancelled", "response.incomplete", "cancelled"),
    ("failed", "response.failed", "failed"),
])  # fmt: skip
def test_cut_short_runs_close_the_open_item_as_incomplete(ending: str, event_type: str, status: str) -> None:
    events = _run(_builder(), ending)
    assert events[-1]["type"] == event_type
    final = events[-1]["response"]
    assert final["status"] == status
    assert final["output"][-1]["status"] == "incomplete"
    if ending == "length":
        assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    if ending == "failed":
        assert final["error"]["code"] == "server_error"


def test_exactly_one_terminal_event() -> None:
    builder = _builder()
    _run(builder)
    with pytest.raises(AssertionError):
        builder.finish("stop", input_tokens=1, output_tokens=1)


def test_projection_of_the_whole_log_is_the_terminal_response() -> None:
    events = _run(_builder())
    assert project(events) == events[-1]["response"]
    assert [item for _index, item in finished_output(events)] == events[-1]["response"]["output"]


def test_projection_of_a_partial_log_shows_text_so_far() -> None:
    events = _run(_builder())
    cut = next(i for i, e in enumerate(events) if e["type"] == "response.output_text.delta") + 1
    partial = project(events[:cut])
    assert partial["status"] == "in_progress"
    assert partial["output"][2]["content"][0]["text"] == "Hel"
    assert partial["output"][2]["status"] == "in_progress"
    # folding the rest onto a stored snapshot gives the same as folding everything
    assert project(events[cut:], base=partial) == project(events)


def test_logprobs_ride_on_text_deltas_and_add_up_in_the_part() -> None:
    builder = _builder()
    lp = [{"token": t, "bytes": list(t.encode()), "logprob": -0.5, "top_logprobs": []} for t in ("A", "B", "C")]
    events = builder.created() + builder.in_progress()
    events += builder.feed([ItemStarted("message")], logprobs=[lp[0]])  # the header token: no text, not kept
    events += builder.feed([ItemDelta("B")], logprobs=[lp[1]])
    events += builder.feed([], logprobs=[lp[2]])  # a token that yields no text yet rides on the next delta
    events += builder.feed([ItemDelta("C")], logprobs=None)
    events += builder.finish("length", input_tokens=1, output_tokens=3)
    deltas = [e["logprobs"] for e in events if e["type"] == "response.output_text.delta"]
    assert deltas == [[lp[1]], [lp[2]]]
    part = events[-1]["response"]["output"][0]["content"][0]
    assert part["logprobs"] == [lp[1], lp[2]]
    assert project(events) == events[-1]["response"]


def test_calls_to_custom_tools_are_custom_tool_call_items() -> None:
    tools = [
        {"type": "custom", "name": "calc", "format": {"type": "grammar", "syntax": "regex", "definition": "[0-9]+"}},
        {"type": "function", "name": "lookup"},
    ]
    request = parse_create_request({"input": "hi", "tools": tools})
    builder = StreamBuilder(
        initial_response(request, response_id="resp_c", model="m", created_at=1, max_output_tokens=10)
    )
    events = builder.created() + builder.in_progress()
    events += builder.feed([ItemStarted("function_call", name="calc"), ItemDelta("4"), ItemDelta("2"), ItemEnded()])
    events += builder.finish("stop", input_tokens=1, output_tokens=4, completed_at=2)
    assert [e["type"] for e in events[2:]] == [
        "response.output_item.added",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
        "response.completed",
    ]
    item = events[-1]["response"]["output"][0]
    assert item["type"] == "custom_tool_call" and item["id"].startswith("ctc_")
    assert (item["name"], item["input"], item["status"]) == ("calc", "42", "completed")
    assert events[-3]["input"] == "42"
    assert project(events[:4])["output"][0]["input"] == "4"  # a read mid-call folds the deltas


def _fold_steps(steps: list[list[Any]], groups: list[int], logprobs: list[Any] | None = None) -> list[dict[str, Any]]:
    """The events of `steps` (one feed each) folded as steps committed in groups of `groups` sizes."""
    builder = _builder()
    events = builder.created() + builder.in_progress()
    step = 0
    for size in groups:
        group: list[dict[str, Any]] = []
        for _ in range(size):
            step_logprobs = [logprobs[step]] if logprobs is not None else None
            builder.fold_into(group, builder.feed(steps[step], logprobs=step_logprobs))
            step += 1
        events += group
    events += builder.finish("stop", input_tokens=1, output_tokens=len(steps), completed_at=2)
    return events


_STEPS: list[list[Any]] = [
    [ItemStarted("reasoning")],
    [ItemDelta("thin")],
    [ItemDelta("king")],
    [ItemEnded(), ItemStarted("message")],
    [ItemDelta("Hel")],
    [ItemDelta("lo")],
    [ItemDelta("!")],
]


def test_steps_committed_together_fold_their_deltas_per_content() -> None:
    one_by_one = _fold_steps(_STEPS, [1] * len(_STEPS))
    folded = _fold_steps(_STEPS, [3, 4])
    assert [e["sequence_number"] for e in folded] == list(range(len(folded)))
    deltas = [(e["type"], e["delta"]) for e in folded if e["type"].endswith(".delta")]
    # The reasoning's two deltas fold; the message's first delta starts the second group after an item boundary.
    assert deltas == [("response.reasoning_text.delta", "thinking"), ("response.output_text.delta", "Hello!")]
    assert len(folded) == len(one_by_one) - 3
    assert folded[-1]["response"] == one_by_one[-1]["response"]  # the same response, fewer events
    assert project(folded) == folded[-1]["response"]
    # A group boundary is never folded across.
    split = _fold_steps(_STEPS, [5, 2])
    assert [e["delta"] for e in split if e["type"] == "response.output_text.delta"] == ["Hel", "lo!"]


def test_folded_deltas_carry_every_token_s_logprobs() -> None:
    steps: list[list[Any]] = [[ItemStarted("message")], [ItemDelta("A")], [], [ItemDelta("B")]]
    lp = [{"token": t, "bytes": list(t.encode()), "logprob": -0.5, "top_logprobs": []} for t in "hABC"]
    folded = _fold_steps(steps, [4], logprobs=lp)
    deltas = [e for e in folded if e["type"] == "response.output_text.delta"]
    assert [(e["delta"], e["logprobs"]) for e in deltas] == [("AB", [lp[1], lp[2], lp[3]])]
    assert folded[-1]["response"]["output"][0]["content"][0]["logprobs"] == [lp[1], lp[2], lp[3]]
    assert _fold_steps(steps, [1] * 4, logprobs=lp)[-1]["response"] == folded[-1]["response"]
