"""A logits constraint that keeps an assistant completion well-formed Harmony.

Grammar (the prompt already ends with `<|start|>assistant`):

    completion := message ( "<|start|>" "assistant" message )*
    message    := header body terminator
    header     := "<|channel|>" ( "analysis" | "final" | "commentary"
                                 | "commentary" " to=functions.NAME" " <|constrain|>json" ) "<|message|>"
    body       := ordinary (non-special) tokens*
    terminator := "<|end|>"                  analysis, commentary preamble
                | "<|end|>" | "<|return|>"   final
                | "<|call|>"                 function call

Headers are enumerated as complete token sequences and walked as a trie, so
only the exact tokenizations the parser expects can be produced. Even a
random-weight model therefore yields output the Harmony parser accepts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
from openai_harmony import HarmonyEncoding

# Body kinds select the terminator set.
_ANALYSIS, _FINAL, _PREAMBLE, _CALL = "analysis", "final", "preamble", "call"


@dataclass
class _TrieNode:
    children: dict[int, _TrieNode] = field(default_factory=dict)
    body: str | None = None  # set on the node reached by `<|message|>`
    allowed: np.ndarray | None = None  # cached sorted child ids


class HarmonyVocab:
    """Per-encoding token facts, computed once: specials, ordinary ids, body masks."""

    def __init__(self, encoding: HarmonyEncoding) -> None:
        self.encoding = encoding

        def special(name: str) -> int:
            (tid,) = encoding.encode(name, allowed_special="all")
            return tid

        self.start, self.end, self.message = special("<|start|>"), special("<|end|>"), special("<|message|>")
        self.channel, self.call, self.ret = special("<|channel|>"), special("<|call|>"), special("<|return|>")
        # Between messages the model must write exactly `<|start|>assistant`.
        self.restart = [self.start, *encoding.encode("assistant")]
        self.restart_allowed = [_frozen([tid]) for tid in self.restart]
        # Ordinary ids: every token the model may write inside a message body.
        # o200k ranks are contiguous: every id below the first special token is ordinary text.
        self.first_special = min(special(s) for s in encoding.special_tokens_set)
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
        self._tries: dict[tuple[str, ...], _TrieNode] = {}
        self.done = _frozen(sorted({self.ret, self.call}))  # only stop tokens once finished

    def header_trie(self, function_names: tuple[str, ...]) -> _TrieNode:
        """The header trie for a set of function names (cached: built once per distinct tool set)."""
        cached = self._tries.get(function_names)
        if cached is not None:
            return cached
        enc = self.encoding
        channel_seq = [self.channel]
        headers: list[tuple[list[int], str]] = [
            (channel_seq + enc.encode("analysis") + [self.message], _ANALYSIS),
            (channel_seq + enc.encode("final") + [self.message], _FINAL),
            (channel_seq + enc.encode("commentary") + [self.message], _PREAMBLE),
        ]
        constrain = enc.encode(" <|constrain|>json", allowed_special="all")
        for name in function_names:
            recipient = enc.encode(f"commentary to=functions.{name}")
            headers.append((channel_seq + recipient + constrain + [self.message], _CALL))
        root = _TrieNode()
        for seq, kind in headers:
            node = root
            for tid in seq:
                node = node.children.setdefault(tid, _TrieNode())
            node.body = kind  # `<|message|>` only ever ends a sequence, so no leaf is an inner node
        _freeze(root)
        if len(self._tries) < 1024:  # bound the cache; an evicted set is just rebuilt (cheap)
            self._tries[function_names] = root
        return root


def _frozen(ids: Iterable[int] | np.ndarray) -> np.ndarray:
    arr = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids, dtype=np.int64)
    arr.setflags(write=False)  # shared between sequences: nobody may mutate it
    return arr


def _freeze(node: _TrieNode) -> None:
    node.allowed = _frozen(sorted(node.children))
    for child in node.children.values():
        _freeze(child)


class HarmonyHeaderConstraint:
    """LogitsConstraint for one completion. allowed_token_ids() returns shared read-only arrays.

    A token outside the grammar (e.g. replayed from an unconstrained run) switches the
    constraint off (None from then on) rather than failing the engine step; the parser
    then judges the output.
    """

    def __init__(self, vocab: HarmonyVocab, function_names: Iterable[str] = ()) -> None:
        self._vocab = vocab
        self._root = vocab.header_trie(tuple(sorted(set(function_names))))
        self._node: _TrieNode | None = self._root  # in a header
        self._body: str | None = None  # in a body of this kind
        self._restart: int | None = None  # position in the forced `<|start|>assistant` between messages
        self._done = False
        self._off = False

    def allowed_token_ids(self) -> np.ndarray | None:
        if self._off:
            return None
        if self._done:
            return self._vocab.done
        if self._restart is not None:
            return self._vocab.restart_allowed[self._restart]
        if self._body is not None:
            return self._vocab.body_allowed[self._body]
        assert self._node is not None and self._node.allowed is not None
        return self._node.allowed

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
                self._restart, self._node = None, self._root
            return
        if self._body is not None:
            if token_id in v.terminators[self._body]:
                if token_id == v.end:
                    self._body = None
                    self._restart = 0
                else:  # <|return|> / <|call|>: the completion is over
                    self._done = True
            elif not 0 <= token_id < v.first_special:
                self._off = True
            return
        assert self._node is not None
        nxt = self._node.children.get(token_id)
        if nxt is None:
            self._off = True
            return
        if nxt.body is not None:
            self._body, self._node = nxt.body, None
        else:
            self._node = nxt
