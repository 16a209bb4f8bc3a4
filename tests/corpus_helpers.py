"""Checks the training-corpus tests share (tests/test_training.py, tests/test_agentic_corpus.py)."""

from __future__ import annotations

from service.engine.base import TokenBitmask
from service.engine.sampling import bitmask_to_bool
from service.prompting.base import ItemStarted, PromptRequest
from service.prompting.harmony import HarmonyFormat


def started_items(fmt: HarmonyFormat, request: PromptRequest, completion: list[int]) -> list[ItemStarted]:
    """Feed a completion through the server's constraint for `request` (asserting it allows each token) and its
    output parser; the items the parser started, in order."""
    constraint = fmt.constraint_for(request)
    parser = fmt.new_parser()
    started: list[ItemStarted] = []
    for token in completion:
        allowed = constraint.allowed_token_ids()
        if isinstance(allowed, TokenBitmask):
            assert bitmask_to_bool(allowed, token + 1)[token]
        else:
            assert allowed is None or token in set(allowed.tolist())
        constraint.accept(token)
        started += [c for c in parser.feed(token) if isinstance(c, ItemStarted)]
    return started
