"""Copy drills added to the corpus (TrainConfig.drills, TrainConfig.repeats): numbers to look up or repeat from a
user turn, and after-tool contrast pairs, each from its own seed so the corpus's samples stay as they are."""

from __future__ import annotations

import json

import numpy as np

from service.prompting.base import PromptRequest
from service.training.corpus import after_tool, context, tool_request
from service.training.sample import EFFORTS, Sample, Step, pick, reasoning_for, user_item
from service.training.tools import TOOLS

# Tools whose salient output is a number: the values the built-in model fails to copy (model card).
_NUMERIC = tuple(t for t in TOOLS if t.salient in {"temperature", "time", "price", "rate", "population"})


def _lookup_drill(rng: np.random.Generator) -> Sample:
    """A user turn states two or three numbers by name and asks for one: the answer copies it, the
    lookup an answer after a tool result needs, with no tool around it."""
    specs = [_NUMERIC[int(i)] for i in rng.permutation(len(_NUMERIC))[: int(rng.integers(2, 4))]]
    facts = [(s.salient, str(s.output(rng, pick(rng, s.values))[s.salient])) for s in specs]
    key, value = facts[int(rng.integers(len(facts)))]
    effort = EFFORTS[int(rng.integers(3))]
    ask = pick(rng, ["What is the {k}?", "Tell me the {k}.", "So what is the {k}?", "Which {k} did I say?"])
    user = " ".join(f"The {k} is {v}." for k, v in facts) + " " + ask.format(k=key)
    think = reasoning_for([f"The {key} is {value}.", f"The user asks for the {key}.", "I will tell the user."], effort)
    answer = pick(rng, ["The {k} is {v}.", "It is {v}.", "You said the {k} is {v}."]).format(k=key, v=value)
    request = PromptRequest(items=[user_item(user)], instructions=None, tools=(), reasoning_effort=effort)
    return Sample(request, (Step("analysis", think), Step("final", answer)), "answer")


def _contrast_pair(rng: np.random.Generator) -> list[Sample]:
    """Two answers after a tool result that differ only in the tool's output (same request, history,
    call and wording): only the output's value tells them apart, so only copying it lowers the loss."""
    ctx = context(rng)
    if not ctx.uses:
        return []
    use = ctx.uses[int(rng.integers(len(ctx.uses)))]
    topic = use.spec.topic.format(v=use.value)
    user = tool_request(rng, use)
    arguments = json.dumps({use.param: use.value})
    seed = int(rng.integers(1 << 62))
    outputs = [use.spec.output(rng, use.value) for _ in range(2)]
    return [
        after_tool(np.random.default_rng(seed), use, user, arguments, topic, ctx.effort, ctx.request, output)
        for output in outputs
    ]


def _repeat_drill(rng: np.random.Generator) -> Sample:
    """A user turn lists two to six numbers of the tool outputs' kinds and asks for them back, in order.
    The values are random, so no memorised number helps: each token after a number's first is the
    token that followed the previous one in the prompt, the continuation copy (an induction head) that
    the answers after a tool result need and the model has not learnt from the corpus alone."""
    specs = [_NUMERIC[int(rng.integers(len(_NUMERIC)))] for _ in range(int(rng.integers(2, 7)))]
    values = [str(s.output(rng, pick(rng, s.values))[s.salient]) for s in specs]
    effort = EFFORTS[int(rng.integers(3))]
    listed = pick(rng, [", ", " and ", "; "]).join(values)
    ask = pick(rng, ["Repeat these numbers: {l}", "Say these back to me: {l}", "Copy this list: {l}", "Read out: {l}"])
    think = reasoning_for(
        ["The user wants the numbers repeated.", "I will copy them in order.", "Nothing else."], effort
    )
    answer = pick(rng, ["{l}.", "Here they are: {l}.", "You said {l}."]).format(l=listed)
    request = PromptRequest(
        items=[user_item(ask.format(l=listed))], instructions=None, tools=(), reasoning_effort=effort
    )
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
