"""Synthetic Harmony conversations, rendered token for token as the server renders prompts.

A sample is a Responses-shaped request (the conversation so far, instructions, function tools,
reasoning effort) plus the assistant completion the model should write. The prompt tokens come
from `HarmonyFormat.render`, the very function the server uses; the completion is written in the
exact token sequences the server's header constraint allows, ending with `<|return|>` (an answer)
or `<|call|>` (a function call).

Here: the samples around function tools (a call, the answer after its result, a request no given tool serves)
and `Renderer`; the sample types in sample.py, tool-less chat turns in chat_turns.py, copy drills in drills.py."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.prompting.base import ConversationItem, FunctionTool, PromptRequest
from service.prompting.harmony import HarmonyFormat
from service.training import words
from service.training.chat_turns import chat_turn
from service.training.sample import (
    EFFORTS,
    Effort,
    Sample,
    Step,
    assistant_item,
    pick,
    reasoning_for,
    user_item,
)
from service.training.tools import TOOLS, ToolSpec


@dataclass(frozen=True)
class _ToolUse:
    spec: ToolSpec
    name: str
    param: str
    value: str


def tool_request(rng: np.random.Generator, use: _ToolUse) -> str:
    return pick(rng, use.spec.asks).format(v=use.value)


def _random_tool_use(rng: np.random.Generator, spec: ToolSpec) -> _ToolUse:
    return _ToolUse(spec, spec.name, spec.param, pick(rng, spec.values))


def _history(rng: np.random.Generator) -> list[ConversationItem]:
    """Earlier turns: user + assistant final (their reasoning is dropped by the renderer anyway)."""
    items: list[ConversationItem] = []
    for _ in range(int(rng.choice([0, 0, 0, 1, 1, 2]))):
        user, reasoning, answer = chat_turn(rng)
        if rng.random() < 0.3:  # a reasoning item in history: Harmony drops it before the last final
            items.append(
                {"type": "reasoning", "content": [{"type": "reasoning_text", "text": reasoning[0]}], "summary": []}
            )
        items += [user_item(user), assistant_item(answer)]
    return items


@dataclass(frozen=True)
class _Context:
    """What a sample's request holds besides its last turn: effort, instructions, tools, earlier turns."""

    effort: Effort
    instructions: str | None
    uses: list[_ToolUse]
    items: list[ConversationItem]

    def request(self, extra: list[ConversationItem]) -> PromptRequest:
        tools: tuple[FunctionTool, ...] = tuple(u.spec.schema() for u in self.uses)
        return PromptRequest(
            items=self.items + extra, instructions=self.instructions, tools=tools, reasoning_effort=self.effort
        )


def context(rng: np.random.Generator) -> _Context:
    effort = EFFORTS[int(rng.integers(3))]
    instructions = pick(rng, words.INSTRUCTIONS) if rng.random() < 0.35 else None
    n_tools = int(rng.choice([0, 1, 1, 2, 2, 3, 3, 4]))
    order = rng.permutation(len(TOOLS))[:n_tools]
    uses = [_random_tool_use(rng, TOOLS[int(i)]) for i in order]
    return _Context(effort, instructions, uses, _history(rng))


def make_sample(rng: np.random.Generator) -> Sample:
    ctx = context(rng)
    effort, uses, request = ctx.effort, ctx.uses, ctx.request
    r = rng.random()

    if uses and r < 0.6:
        use = uses[int(rng.integers(len(uses)))]
        topic = use.spec.topic.format(v=use.value)
        user = tool_request(rng, use)
        arguments = json.dumps({use.param: use.value})
        think = reasoning_for(
            [f"The user wants {topic}.", f"The {use.name} tool can get it.", f"Call it with {use.param} {use.value}."],
            effort,
        )
        if r < 0.3:
            steps = (Step("analysis", think), Step("call", arguments, use.name))
            return Sample(request([user_item(user)]), steps, "call", tool=use.name, argument=(use.param, use.value))
        return after_tool(rng, use, user, arguments, topic, effort, request)
    if r < 0.75:
        # A request for something no given tool does: say so, without a call.
        names = {u.spec.name for u in uses}
        missing = [t for t in TOOLS if t.name not in names]
        use = _random_tool_use(rng, missing[int(rng.integers(len(missing)))])
        topic = use.spec.topic.format(v=use.value)
        think = reasoning_for(
            [f"The user wants {topic}.", "No available tool can get it.", "I will say so politely."], effort
        )
        answer = pick(
            rng,
            [
                f"Sorry, I cannot get {topic} because I have no tool for it.",
                f"I have no way to check {topic} right now.",
            ],
        )
        steps = (Step("analysis", think), Step("final", answer))
        return Sample(request([user_item(tool_request(rng, use))]), steps, "answer")
    user, reasoning, answer = chat_turn(rng)
    steps = (Step("analysis", reasoning_for(reasoning, effort)), Step("final", answer))
    return Sample(request([user_item(user)]), steps, "answer")


def after_tool(
    rng: np.random.Generator,
    use: _ToolUse,
    user: str,
    arguments: str,
    topic: str,
    effort: Effort,
    request: Callable[[list[ConversationItem]], PromptRequest],
    output: dict[str, Any] | None = None,
) -> Sample:
    """The turn after a call's result: the answer copies the output's salient value. `output`: the tool's
    result, else drawn from `rng`."""
    think = reasoning_for(
        [f"The user wants {topic}.", f"The {use.name} tool can get it.", f"Call it with {use.param} {use.value}."],
        effort,
    )
    if output is None:
        output = use.spec.output(rng, use.value)
    call_id = f"call_{int(rng.integers(1 << 30)):x}"
    turn: list[ConversationItem] = [user_item(user)]
    if rng.random() < 0.5:  # the ongoing turn's reasoning is kept (clients send it back, or not)
        turn.append({"type": "reasoning", "content": [{"type": "reasoning_text", "text": think}], "summary": []})
    turn.append({"type": "function_call", "call_id": call_id, "name": use.name, "arguments": arguments})
    turn.append({"type": "function_call_output", "call_id": call_id, "output": json.dumps(output)})
    salient = str(output[use.spec.salient])
    answer = pick(rng, use.spec.answers).format(v=use.value, **output)
    think = reasoning_for(  # the salient value first: copied from the tool output, then again in the answer
        [f"The {use.spec.salient} is {salient}.", f"The tool returned {topic}.", "I will tell the user."], effort
    )
    steps = (Step("analysis", think), Step("final", answer))
    return Sample(request(turn), steps, "after_tool", salient=salient)


def make_samples(seed: int, count: int) -> list[Sample]:
    rng = np.random.default_rng(seed)
    return [make_sample(rng) for _ in range(count)]


class Renderer:
    """Samples -> token ids: the prompt as the server renders it, the completion as the constraint allows."""

    def __init__(self, fmt: HarmonyFormat | None = None) -> None:
        self.fmt = fmt or HarmonyFormat()
        enc = self.fmt.encoding

        def special(name: str) -> int:
            (tid,) = enc.encode(name, allowed_special="all")
            return int(tid)

        self.start, self.end, self.message = special("<|start|>"), special("<|end|>"), special("<|message|>")
        self.channel, self.call, self.ret = special("<|channel|>"), special("<|call|>"), special("<|return|>")
        self.assistant = list(enc.encode("assistant"))
        self.constrain = list(enc.encode(" <|constrain|>json", allowed_special="all"))

    def text(self, text: str) -> list[int]:
        return list(self.fmt.encoding.encode(text, allowed_special=set(), disallowed_special=()))  # no regex per call

    def prompt(self, sample: Sample) -> list[int]:
        return self.fmt.render(sample.request)

    def completion(self, steps: tuple[Step, ...]) -> list[int]:
        return self.marked_completion(steps, None)[0]

    def marked_completion(self, steps: tuple[Step, ...], value: str | None) -> tuple[list[int], list[bool]]:
        """The completion's ids, and for each id whether it writes part of `value` (the tool output's
        salient value, copied into the analysis and the final answer) in a message's text."""
        out: list[int] = []
        marks: list[bool] = []

        def add(ids: list[int], marked: list[bool] | None = None) -> None:
            out.extend(ids)
            marks.extend(marked if marked is not None else [False] * len(ids))

        for i, step in enumerate(steps):
            if i:
                add([self.start, *self.assistant])
            body = self.text(step.text)
            marked = self.value_marks(step.text, body, value) if value else None
            if step.channel == "call":
                assert step.recipient is not None
                header = self.text(f"commentary to=functions.{step.recipient}") + self.constrain
                add([self.channel, *header, self.message])
                add(body, marked)
                add([self.call])
            else:
                last = i == len(steps) - 1
                terminator = self.ret if last and step.channel == "final" else self.end
                add([self.channel, *self.text(step.channel), self.message])
                add(body, marked)
                add([terminator])
        return out, marks

    def value_marks(self, text: str, ids: list[int], value: str) -> list[bool]:
        """Which of `text`'s ids (its encoding) overlap an occurrence of `value`. The text is encoded whole
        (as the model writes it), so a value's first token may carry a leading space. Token ends: each
        token's decoded length while the text is ASCII, else by decoding prefixes (a token may hold part
        of a character; the encoding has no per-token byte lookup)."""
        spans = [(m.start(), m.end()) for m in re.finditer(re.escape(value), text)]
        if not spans:
            return [False] * len(ids)
        decode = self.fmt.encoding.decode
        if text.isascii():
            ends = np.cumsum([len(decode([tid])) for tid in ids]).tolist()
        else:
            ends = [len(decode(ids[: k + 1])) for k in range(len(ids))]
        assert ends[-1] == len(text), "the text does not decode back to itself"
        marks = [any(pos < b and a < end for a, b in spans) for pos, end in zip([0, *ends[:-1]], ends, strict=True)]
        return marks
