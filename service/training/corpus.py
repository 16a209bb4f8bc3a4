"""Synthetic Harmony conversations, rendered token for token as the server renders prompts.

A sample is a Responses-shaped request (the conversation so far, instructions, function tools,
reasoning effort) plus the assistant completion the model should write. The prompt tokens come
from `HarmonyFormat.render`, the very function the server uses; the completion is written in the
exact token sequences the server's header constraint allows, ending with `<|return|>` (an answer)
or `<|call|>` (a function call)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from service.prompting.base import ConversationItem, FunctionTool, PromptRequest
from service.prompting.harmony import HarmonyFormat
from service.training import words
from service.training.tools import TOOLS, ToolSpec

Kind = Literal["answer", "call", "after_tool"]
Effort = Literal["low", "medium", "high"]
EFFORTS: tuple[Effort, ...] = ("low", "medium", "high")


@dataclass(frozen=True)
class Step:
    """One assistant message of a completion: channel "analysis", "final" or "call"."""

    channel: str
    text: str
    recipient: str | None = None  # the function name of a call


@dataclass(frozen=True)
class Sample:
    request: PromptRequest
    completion: tuple[Step, ...]
    kind: Kind
    tool: str | None = None  # the expected call's function name (kind "call")
    argument: tuple[str, str] | None = None  # (parameter, value copied from the user turn)
    salient: str | None = None  # the tool output's value the answer must contain (kind "after_tool")


def _pick(rng: np.random.Generator, seq: tuple[str, ...] | list[str]) -> str:
    return seq[int(rng.integers(len(seq)))]


def _user(text: str) -> ConversationItem:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def _assistant(text: str) -> ConversationItem:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def _reasoning(sentences: list[str], effort: Effort) -> str:
    """Low effort: one sentence; medium: two; high: three (effort-dependent length)."""
    return " ".join(sentences[: {"low": 1, "medium": 2, "high": 3}[effort]])


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def chat_turn(rng: np.random.Generator) -> tuple[str, list[str], str]:
    """A request no tool serves: (user text, reasoning sentences, final answer)."""
    kind = int(rng.integers(11))
    if kind == 0:
        user = _pick(rng, ["Hello", "Hi", "Hi there!", "Hey", "Good morning", "Say hello", "Hello, how are you?"])
        answer = _pick(rng, ["Hello! How can I help you today?", "Hi! What can I do for you?", "Hello there!"])
        return user, ["The user greets me.", "I should greet them back.", "A short friendly reply is enough."], answer
    if kind == 1:
        name = _pick(rng, words.NAMES)
        user = _pick(rng, ["Say hello to {n}.", "Greet {n} for me.", "Please say hi to {n}.", "Welcome {n}."])
        answer = _pick(rng, ["Hello, {n}! Nice to meet you.", "Hi {n}, welcome!", "Hello {n}!"])
        return (
            user.format(n=name),
            [f"The user wants me to greet {name}.", "I will say hello.", "Keep it short."],
            (answer.format(n=name)),
        )
    if kind == 2:
        a = _pick(rng, words.ANIMALS)
        user = _pick(
            rng, ["Tell me about the {a}.", "What is a {a}?", "Give me a fun fact about the {a}.", "Describe a {a}."]
        )
        answer = _pick(
            rng,
            [
                "The {a} is an animal that many people find interesting.",
                "A {a} is an animal. I know only a little about the {a}.",
            ],
        )
        return (
            user.format(a=a),
            [f"The user asks about the {a}.", "I have no tool for this.", "A short answer will do."],
            (answer.format(a=a)),
        )
    if kind == 3:
        phrase = f"the {_pick(rng, words.ADJECTIVES)} {_pick(rng, words.ANIMALS)} likes the {_pick(rng, words.NOUNS)}"
        user = _pick(rng, ["Repeat after me: {p}", "Say this back to me: {p}", "Echo this: {p}", "Please repeat: {p}"])
        return (
            user.format(p=phrase),
            ["The user wants me to repeat a phrase.", "I will repeat it exactly.", "Nothing else."],
            (_cap(phrase) + "."),
        )
    if kind == 4:
        topic = _pick(rng, words.TOPICS)
        adj = _pick(rng, words.ADJECTIVES)
        user = _pick(
            rng, ["Write a short poem about {t}.", "Write two lines about {t}.", "A tiny poem on {t}, please."]
        )
        answer = f"{_cap(topic)}, so {adj} and near,\n{topic} stays with me all year."
        return (
            user.format(t=topic),
            [f"The user wants a short poem about {topic}.", "Two lines are enough.", ("I will keep it simple.")],
            answer,
        )
    if kind == 5:
        verb, noun = _pick(rng, words.VERBS), _pick(rng, words.NOUNS)
        user = _pick(
            rng,
            [
                "Can you help me {v} my {n}?",
                "How do I {v} my {n}?",
                "Any tips to {v} the {n}?",
                "I need to {v} my {n}.",
            ],
        )
        answer = f"Sure. To {verb} your {noun}, make a short list and take one step at a time."
        return (
            user.format(v=verb, n=noun),
            [f"The user wants help to {verb} the {noun}.", "Give simple advice.", ("No tool is needed.")],
            answer,
        )
    if kind == 6:
        c = _pick(rng, words.COLORS)
        user = _pick(
            rng, ["What do you think of the color {c}?", "Is {c} a nice color?", "Tell me about the color {c}."]
        )
        return (
            user.format(c=c),
            [f"The user asks about the color {c}.", "Answer kindly.", "One sentence."],
            (f"{_cap(c)} is a lovely color."),
        )
    if kind == 7:
        n = int(rng.integers(2, 11))
        user = _pick(rng, ["Count from 1 to {n}.", "Count to {n}.", "Please count up to {n}."]).format(n=n)
        return (
            user,
            [f"The user wants me to count to {n}.", "I will list the numbers.", "Then stop."],
            (", ".join(str(i) for i in range(1, n + 1)) + "."),
        )
    if kind == 8:
        user = _pick(rng, ["Thanks!", "Thank you", "Thanks a lot.", "Great, thank you!", "Bye", "Goodbye!"])
        answer = "Goodbye! Have a nice day." if user.startswith(("Bye", "Good")) else "You're welcome!"
        return user, ["The user is polite.", "I reply briefly.", "Nothing else is needed."], answer
    if kind == 9:
        user = _pick(
            rng,
            [
                "What can you do?",
                "Who are you?",
                "What are you?",
                "Help",
                "Tell me a joke.",
                "What is the meaning of life?",
            ],
        )
        answer = "I am a small built-in assistant. I can answer simple requests and call the tools I am given."
        return user, ["The user asks what I can do.", "I am a small model.", "Say so briefly."], answer
    pool = words.NOUNS + words.ANIMALS + words.ADJECTIVES + words.VERBS + words.COLORS
    n = int(rng.integers(1, 6))
    user = " ".join(_pick(rng, pool) for _ in range(n)) + _pick(rng, ["", "?", ".", "!"])
    answer = _pick(
        rng, ["I am not sure what you mean. Could you say more?", "Could you tell me a bit more about what you need?"]
    )
    return _cap(user), ["The request is unclear.", "I should ask for details.", "Keep it short."], answer


@dataclass(frozen=True)
class _ToolUse:
    spec: ToolSpec
    name: str
    param: str
    value: str


def _tool_request(rng: np.random.Generator, use: _ToolUse) -> str:
    return _pick(rng, use.spec.asks).format(v=use.value)


def _random_tool_use(rng: np.random.Generator, spec: ToolSpec) -> _ToolUse:
    return _ToolUse(spec, spec.name, spec.param, _pick(rng, spec.values))


def _history(rng: np.random.Generator) -> list[ConversationItem]:
    """Earlier turns: user + assistant final (their reasoning is dropped by the renderer anyway)."""
    items: list[ConversationItem] = []
    for _ in range(int(rng.choice([0, 0, 0, 1, 1, 2]))):
        user, reasoning, answer = chat_turn(rng)
        if rng.random() < 0.3:  # a reasoning item in history: Harmony drops it before the last final
            items.append(
                {"type": "reasoning", "content": [{"type": "reasoning_text", "text": reasoning[0]}], "summary": []}
            )
        items += [_user(user), _assistant(answer)]
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


def _context(rng: np.random.Generator) -> _Context:
    effort = EFFORTS[int(rng.integers(3))]
    instructions = _pick(rng, words.INSTRUCTIONS) if rng.random() < 0.35 else None
    n_tools = int(rng.choice([0, 1, 1, 2, 2, 3, 3, 4]))
    order = rng.permutation(len(TOOLS))[:n_tools]
    uses = [_random_tool_use(rng, TOOLS[int(i)]) for i in order]
    return _Context(effort, instructions, uses, _history(rng))


def make_sample(rng: np.random.Generator) -> Sample:
    ctx = _context(rng)
    effort, uses, request = ctx.effort, ctx.uses, ctx.request
    r = rng.random()

    if uses and r < 0.6:
        use = uses[int(rng.integers(len(uses)))]
        topic = use.spec.topic.format(v=use.value)
        user = _tool_request(rng, use)
        arguments = json.dumps({use.param: use.value})
        think = _reasoning(
            [f"The user wants {topic}.", f"The {use.name} tool can get it.", f"Call it with {use.param} {use.value}."],
            effort,
        )
        if r < 0.3:
            steps = (Step("analysis", think), Step("call", arguments, use.name))
            return Sample(request([_user(user)]), steps, "call", tool=use.name, argument=(use.param, use.value))
        return _after_tool(rng, use, user, arguments, topic, effort, request)
    if r < 0.75:
        # A request for something no given tool does: say so, without a call.
        names = {u.spec.name for u in uses}
        missing = [t for t in TOOLS if t.name not in names]
        use = _random_tool_use(rng, missing[int(rng.integers(len(missing)))])
        topic = use.spec.topic.format(v=use.value)
        think = _reasoning(
            [f"The user wants {topic}.", "No available tool can get it.", "I will say so politely."], effort
        )
        answer = _pick(
            rng,
            [
                f"Sorry, I cannot get {topic} because I have no tool for it.",
                f"I have no way to check {topic} right now.",
            ],
        )
        steps = (Step("analysis", think), Step("final", answer))
        return Sample(request([_user(_tool_request(rng, use))]), steps, "answer")
    user, reasoning, answer = chat_turn(rng)
    steps = (Step("analysis", _reasoning(reasoning, effort)), Step("final", answer))
    return Sample(request([_user(user)]), steps, "answer")


def _after_tool(
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
    think = _reasoning(
        [f"The user wants {topic}.", f"The {use.name} tool can get it.", f"Call it with {use.param} {use.value}."],
        effort,
    )
    if output is None:
        output = use.spec.output(rng, use.value)
    call_id = f"call_{int(rng.integers(1 << 30)):x}"
    turn: list[ConversationItem] = [_user(user)]
    if rng.random() < 0.5:  # the ongoing turn's reasoning is kept (clients send it back, or not)
        turn.append({"type": "reasoning", "content": [{"type": "reasoning_text", "text": think}], "summary": []})
    turn.append({"type": "function_call", "call_id": call_id, "name": use.name, "arguments": arguments})
    turn.append({"type": "function_call_output", "call_id": call_id, "output": json.dumps(output)})
    salient = str(output[use.spec.salient])
    answer = _pick(rng, use.spec.answers).format(v=use.value, **output)
    think = _reasoning(  # the salient value first: copied from the tool output, then again in the answer
        [f"The {use.spec.salient} is {salient}.", f"The tool returned {topic}.", "I will tell the user."], effort
    )
    steps = (Step("analysis", think), Step("final", answer))
    return Sample(request(turn), steps, "after_tool", salient=salient)


def make_samples(seed: int, count: int) -> list[Sample]:
    rng = np.random.default_rng(seed)
    return [make_sample(rng) for _ in range(count)]


# Tools whose salient output is a number: the values the built-in model fails to copy (model card).
_NUMERIC = tuple(t for t in TOOLS if t.salient in {"temperature", "time", "price", "rate", "population"})


def _lookup_drill(rng: np.random.Generator) -> Sample:
    """A user turn states two or three numbers by name and asks for one: the answer copies it, the
    lookup an answer after a tool result needs, with no tool around it."""
    specs = [_NUMERIC[int(i)] for i in rng.permutation(len(_NUMERIC))[: int(rng.integers(2, 4))]]
    facts = [(s.salient, str(s.output(rng, _pick(rng, s.values))[s.salient])) for s in specs]
    key, value = facts[int(rng.integers(len(facts)))]
    effort = EFFORTS[int(rng.integers(3))]
    ask = _pick(rng, ["What is the {k}?", "Tell me the {k}.", "So what is the {k}?", "Which {k} did I say?"])
    user = " ".join(f"The {k} is {v}." for k, v in facts) + " " + ask.format(k=key)
    think = _reasoning([f"The {key} is {value}.", f"The user asks for the {key}.", "I will tell the user."], effort)
    answer = _pick(rng, ["The {k} is {v}.", "It is {v}.", "You said the {k} is {v}."]).format(k=key, v=value)
    request = PromptRequest(items=[_user(user)], instructions=None, tools=(), reasoning_effort=effort)
    return Sample(request, (Step("analysis", think), Step("final", answer)), "answer")


def _contrast_pair(rng: np.random.Generator) -> list[Sample]:
    """Two answers after a tool result that differ only in the tool's output (same request, history,
    call and wording): only the output's value tells them apart, so only copying it lowers the loss."""
    ctx = _context(rng)
    if not ctx.uses:
        return []
    use = ctx.uses[int(rng.integers(len(ctx.uses)))]
    topic = use.spec.topic.format(v=use.value)
    user = _tool_request(rng, use)
    arguments = json.dumps({use.param: use.value})
    seed = int(rng.integers(1 << 62))
    outputs = [use.spec.output(rng, use.value) for _ in range(2)]
    return [
        _after_tool(np.random.default_rng(seed), use, user, arguments, topic, ctx.effort, ctx.request, output)
        for output in outputs
    ]


def _repeat_drill(rng: np.random.Generator) -> Sample:
    """A user turn lists two to six numbers of the tool outputs' kinds and asks for them back, in order.
    The values are random, so no memorised number helps: each token after a number's first is the
    token that followed the previous one in the prompt, the continuation copy (an induction head) that
    the answers after a tool result need and the model has not learnt from the corpus alone."""
    specs = [_NUMERIC[int(rng.integers(len(_NUMERIC)))] for _ in range(int(rng.integers(2, 7)))]
    values = [str(s.output(rng, _pick(rng, s.values))[s.salient]) for s in specs]
    effort = EFFORTS[int(rng.integers(3))]
    listed = _pick(rng, [", ", " and ", "; "]).join(values)
    ask = _pick(rng, ["Repeat these numbers: {l}", "Say these back to me: {l}", "Copy this list: {l}", "Read out: {l}"])
    think = _reasoning(["The user wants the numbers repeated.", "I will copy them in order.", "Nothing else."], effort)
    answer = _pick(rng, ["{l}.", "Here they are: {l}.", "You said {l}."]).format(l=listed)
    request = PromptRequest(items=[_user(ask.format(l=listed))], instructions=None, tools=(), reasoning_effort=effort)
    return Sample(request, (Step("analysis", think), Step("final", answer)), "answer")


def make_repeats(seed: int, count: int) -> list[Sample]:
    """Repeat drills added to the corpus (`TrainConfig.repeats`), from their own seed."""
    rng = np.random.default_rng(seed)
    return [_repeat_drill(rng) for _ in range(count)]


def make_drills(seed: int, count: int) -> list[Sample]:
    """Copy drills added to the corpus (`TrainConfig.drills`): lookups in a user turn and after-tool
    contrast pairs, half each. Drawn from their own seed, so the corpus's samples stay as they are."""
    rng = np.random.default_rng(seed)
    out: list[Sample] = []
    while len(out) < count:
        out += [_lookup_drill(rng)] if rng.random() < 0.5 else _contrast_pair(rng)
    return out[:count]


class Renderer:
    """Samples -> token ids: the prompt as the server renders it, the completion as the constraint allows."""

    def __init__(self, fmt: HarmonyFormat | None = None) -> None:
        self.fmt = fmt or HarmonyFormat()
        enc = self.fmt.encoding

        def special(name: str) -> int:
            (tid,) = enc.encode(name, allowed_special="all")
            return tid

        self.start, self.end, self.message = special("<|start|>"), special("<|end|>"), special("<|message|>")
        self.channel, self.call, self.ret = special("<|channel|>"), special("<|call|>"), special("<|return|>")
        self.assistant = list(enc.encode("assistant"))
        self.constrain = list(enc.encode(" <|constrain|>json", allowed_special="all"))

    def text(self, text: str) -> list[int]:
        return list(self.fmt.encoding.encode(text, allowed_special=set()))

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
