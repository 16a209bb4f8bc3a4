"""A logits constraint that keeps an assistant completion well-formed Harmony, and holds it to
what the request allows.

Grammar (the prompt already ends with `<|start|>assistant`):

    completion := message ( "<|start|>" "assistant" message )*
    message    := header body terminator
    header     := "<|channel|>" ( "analysis" | "final" | "commentary"
                                 | "commentary" " to=functions.NAME" " <|constrain|>json"   function tools
                                 | "commentary" " to=functions.NAME" ) "<|message|>"          custom tools
    body       := ordinary (non-special) tokens*, or a sentence of the body's grammar
    terminator := "<|end|>"                  analysis, commentary preamble
                | "<|end|>" | "<|return|>"   final (only "<|return|>" when the answer has a grammar)
                | "<|call|>"                 tool call

Headers are enumerated as complete token sequences and walked as a trie, so
only the exact tokenizations the parser expects can be produced. Even a
random-weight model therefore yields output the Harmony parser accepts.

A DecodingPlan (service/constraints/plan.py) narrows this: which tools may be called
(tool_choice), whether a final answer is allowed (not with `required` or a named tool), and
the grammar of the final body (text.format) and of each call body (function parameters, custom
tool grammars), enforced by an llguidance matcher whose packed bitmask goes to the engine; once
the grammar is complete only the terminator may follow. The reasoning budget counts the tokens
of analysis and preamble bodies; when it is spent, the open body is closed with `<|end|>` and
the next header can only open the final channel or a permitted call.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

import llguidance
import numpy as np
from openai_harmony import HarmonyEncoding

from service.constraints.compiler import compile_grammar
from service.constraints.matcher import GrammarMatcher
from service.constraints.plan import CallTarget, DecodingPlan, compile_target
from service.engine.base import AllowedTokens, TokenBitmask

log = logging.getLogger(__name__)

# Body kinds select the terminator set.
_ANALYSIS, _FINAL, _PREAMBLE, _CALL = "analysis", "final", "preamble", "call"
_FREE = (_ANALYSIS, _PREAMBLE)  # bodies the reasoning budget counts

# A header trie is keyed by: the callable tools (name, custom), may it answer, the free-text kinds it may open.
TrieKey = tuple[tuple[tuple[str, bool], ...], bool, tuple[str, ...]]


@dataclass
class _TrieNode:
    children: dict[int, _TrieNode] = field(default_factory=dict)
    body: str | None = None  # set on the node reached by `<|message|>`
    call: str | None = None  # the tool a call header addresses
    allowed: np.ndarray | None = None  # cached sorted child ids


def _special_ids(encoding: HarmonyEncoding) -> list[int]:
    """The ids of every special token: one encode of them all, each written once (a special token's text is
    always read as that one token), rather than a thousand calls that each copy the set of specials."""
    names = sorted(encoding.special_tokens_set)
    ids = encoding.encode("".join(names), allowed_special="all")
    if len(ids) != len(names):  # not one id per name: ask each on its own
        ids = [tid for name in names for tid in encoding.encode(name, allowed_special="all")]
    return [int(tid) for tid in ids]


class HarmonyVocab:
    """Per-encoding token facts, computed once: specials, ordinary ids, body masks."""

    def __init__(self, encoding: HarmonyEncoding) -> None:
        self.encoding = encoding

        def special(name: str) -> int:
            (tid,) = encoding.encode(name, allowed_special="all")
            return int(tid)

        self.start, self.end, self.message = special("<|start|>"), special("<|end|>"), special("<|message|>")
        self.channel, self.call, self.ret = special("<|channel|>"), special("<|call|>"), special("<|return|>")
        # Between messages the model must write exactly `<|start|>assistant`.
        self.restart = [self.start, *encoding.encode("assistant")]
        self.restart_allowed = [_frozen([tid]) for tid in self.restart]
        # Ordinary ids: every token the model may write inside a message body.
        # o200k ranks are contiguous: every id below the first special token is ordinary text.
        self.first_special = min(_special_ids(encoding))
        ids = np.arange(self.first_special, dtype=np.int64)

        def body(*terminators: int) -> np.ndarray:
            return _frozen(np.concatenate([ids, np.array(sorted(terminators), dtype=np.int64)]))

        self.body_allowed = {
            _ANALYSIS: body(self.end),
            _PREAMBLE: body(self.end),
            _FINAL: body(self.end, self.ret),
            _CALL: body(self.call),
        }
        self.terminators: dict[str, frozenset[int]] = {
            _ANALYSIS: frozenset({self.end}),
            _PREAMBLE: frozenset({self.end}),
            _FINAL: frozenset({self.end, self.ret}),
            _CALL: frozenset({self.call}),
        }
        self.end_only = _frozen([self.end])
        self._tries: dict[TrieKey, _TrieNode] = {}
        self.done = _frozen(sorted({self.ret, self.call}))  # only stop tokens once finished

    def trie(self, key: TrieKey) -> _TrieNode:
        """The header trie for (callable tools, may answer, free-text kinds); cached per distinct key."""
        cached = self._tries.get(key)
        if cached is not None:
            return cached
        calls, final, free = key
        enc = self.encoding
        channel_seq = [self.channel]
        headers: list[tuple[list[int], str, str | None]] = []
        if _ANALYSIS in free:
            headers.append((channel_seq + enc.encode("analysis") + [self.message], _ANALYSIS, None))
        if _PREAMBLE in free:
            headers.append((channel_seq + enc.encode("commentary") + [self.message], _PREAMBLE, None))
        if final or not calls:
            headers.append((channel_seq + enc.encode("final") + [self.message], _FINAL, None))
        constrain = enc.encode(" <|constrain|>json", allowed_special="all")
        for name, custom in calls:
            recipient = enc.encode(f"commentary to={call_recipient(name)}")
            headers.append((channel_seq + recipient + ([] if custom else constrain) + [self.message], _CALL, name))
        root = _TrieNode()
        for seq, kind, call in headers:
            node = root
            for tid in seq:
                node = node.children.setdefault(tid, _TrieNode())
            node.body, node.call = kind, call  # `<|message|>` only ever ends a sequence
        _freeze(root)
        if len(self._tries) < 1024:  # bound the cache; an evicted set is just rebuilt (cheap)
            self._tries[key] = root
        return root


def call_recipient(name: str) -> str:
    """Function tools are `functions.NAME`; MCP tools `LABEL.NAME`; the code interpreter `@python` is `python`."""
    if name.startswith("@"):
        return name[1:]
    return name if "." in name else f"functions.{name}"


def _frozen(ids: Iterable[int] | np.ndarray) -> np.ndarray:
    arr = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids, dtype=np.int64)
    arr.setflags(write=False)  # shared between sequences: nobody may mutate it
    return arr


def _freeze(node: _TrieNode) -> None:
    node.allowed = _frozen(sorted(node.children))
    for child in node.children.values():
        _freeze(child)


class HarmonyHeaderConstraint:
    """LogitsConstraint for one completion. allowed_token_ids() returns shared read-only arrays,
    or a packed bitmask inside a body that has a grammar.

    A token outside the grammar (e.g. replayed from an unconstrained run) switches the header
    constraint off (None from then on) rather than failing the engine step; the parser then
    judges the output. A grammar matcher that enters its error state allows only the body's
    terminator, so the run ends instead of looping.
    """

    def __init__(
        self,
        vocab: HarmonyVocab,
        function_names: Iterable[str] = (),
        *,
        plan: DecodingPlan | None = None,
        tokenizer: llguidance.LLTokenizer | None = None,
    ) -> None:
        if plan is None:
            plan = DecodingPlan(calls=tuple(CallTarget(n, False, None, "") for n in sorted(set(function_names))))
        self._vocab = vocab
        self._plan = plan
        self._tokenizer = tokenizer
        self._targets = {call.name: call for call in plan.calls}
        calls = tuple(sorted((call.name, call.custom) for call in plan.calls))
        # A structured answer is the only message besides reasoning: no commentary preamble, so that
        # the response's output_text is exactly the JSON.
        free = (_ANALYSIS,) if plan.final_grammar is not None else _FREE
        self._root = vocab.trie((calls, plan.final, free))
        # After the reasoning budget: no more analysis or preamble.
        self._answer_root = vocab.trie((calls, plan.final, ()))
        self._node: _TrieNode | None = self._root  # in a header
        self._body: str | None = None  # in a body of this kind
        self._matcher: GrammarMatcher | None = None  # the body's grammar, if it has one
        self._restart: int | None = None  # position in the forced `<|start|>assistant` between messages
        self._free_tokens = 0  # analysis + preamble body tokens so far
        self._done = False
        self._off = False
        self.error: str | None = None  # a grammar matcher's error, if one occurred

    def _budget_spent(self) -> bool:
        budget = self._plan.reasoning_budget
        return budget is not None and self._free_tokens >= budget

    def allowed_token_ids(self) -> AllowedTokens | None:
        if self._off:
            return None
        if self._done:
            return self._vocab.done
        if self._restart is not None:
            return self._vocab.restart_allowed[self._restart]
        if self._body is not None:
            if self._matcher is not None:
                return TokenBitmask(self._matcher.bitmask())
            if self._body in _FREE and self._budget_spent():
                return self._vocab.end_only
            return self._vocab.body_allowed[self._body]
        assert self._node is not None and self._node.allowed is not None
        return self._node.allowed

    def failure(self) -> str | None:
        """The body's grammar ran out of llguidance's per-step fuel (the engine fails the run)."""
        return self._matcher.exhausted if self._matcher is not None else None

    def accept(self, token_id: int) -> None:
        if self._off or self._done:
            return
        v = self._vocab
        if self._restart is not None:
            if token_id != v.restart[self._restart]:
                self._off = True
                return
            self._restart += 1
            if self._restart == len(v.restart):
                self._restart = None
                self._node = self._answer_root if self._budget_spent() else self._root
            return
        if self._body is not None:
            self._accept_body(token_id)
            return
        assert self._node is not None
        nxt = self._node.children.get(token_id)
        if nxt is None:
            self._off = True
            return
        if nxt.body is not None:
            self._body, self._node = nxt.body, None
            self._matcher = self._new_matcher(nxt.body, nxt.call)
        else:
            self._node = nxt

    def _accept_body(self, token_id: int) -> None:
        v = self._vocab
        assert self._body is not None
        if token_id in v.terminators[self._body]:
            self._matcher = None
            if token_id == v.end:
                self._body = None
                self._restart = 0
            else:  # <|return|> / <|call|>: the completion is over
                self._done = True
            return
        if self._matcher is not None:
            if not self._matcher.accept(token_id) and self.error is None:
                self.error = self._matcher.error
                log.warning("grammar matcher error (the body ends at its terminator): %s", self.error)
            return
        if not 0 <= token_id < v.first_special:
            self._off = True
            return
        if self._body in _FREE:
            self._free_tokens += 1

    def _new_matcher(self, body: str, call: str | None) -> GrammarMatcher | None:
        if self._tokenizer is None:
            return None
        if body == _FINAL and self._plan.final_grammar is not None:
            # Checked against the size limit when the request was created; cached by content hash since.
            grammar = compile_grammar(self._plan.final_grammar, self._tokenizer, max_bytes=1 << 62)
            return GrammarMatcher(self._tokenizer, grammar, (self._vocab.ret,))
        target = self._targets.get(call) if body == _CALL and call is not None else None
        compiled = compile_target(target, self._tokenizer) if target is not None else None
        return GrammarMatcher(self._tokenizer, compiled, (self._vocab.call,)) if compiled is not None else None
