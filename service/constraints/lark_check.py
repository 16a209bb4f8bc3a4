"""Is a Lark grammar's language empty? A productivity check over its rules.

llguidance accepts `start: "a" start` (every derivation recurses forever): a run constrained by
it could never finish. A rule is *productive* when some alternative consists only of terminals,
optional parts and productive rules; the language is empty when `start` is not productive.
Constructs this small reader does not understand (templates, %json, ...) skip the check
(answer None) rather than refuse a grammar that may be fine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+|//[^\n]*)
  | (?P<string>"(?:[^"\\]|\\.)*"i?)
  | (?P<regex>/(?:[^/\\\n]|\\.)+/[imsulx]*)
  | (?P<special><\|[^|>]*\|>|<\[[^\]]*\]>)
  | (?P<alias>->\s*[A-Za-z_][A-Za-z0-9_]*)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<range>\.\.)
  | (?P<number>\d+)
  | (?P<punct>[()\[\]|?*+~])
    """,
    re.VERBOSE,
)
_RULE_START = re.compile(r"^[?!]?([A-Za-z_][A-Za-z0-9_]*)(?:\.-?\d+)?\s*:(?!:)")


class _Unsupported(Exception):
    pass


@dataclass
class _Node:
    kind: str  # "alt" (any of children), "seq" (all of children), "term", "ref", "opt"
    children: list[_Node]
    name: str = ""


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise _Unsupported(text[pos : pos + 10])
        pos = match.end()
        kind = match.lastgroup or ""
        if kind not in ("ws", "alias"):
            out.append((kind, match.group()))
    return out


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.i = 0

    def peek(self) -> str | None:
        return self.tokens[self.i][1] if self.i < len(self.tokens) else None

    def expansions(self) -> _Node:
        alts = [self.sequence()]
        while self.peek() == "|":
            self.i += 1
            alts.append(self.sequence())
        return _Node("alt", alts)

    def sequence(self) -> _Node:
        items: list[_Node] = []
        while self.peek() not in (None, "|", ")", "]"):
            items.append(self.item())
        return _Node("seq", items)

    def item(self) -> _Node:
        kind, text = self.tokens[self.i]
        self.i += 1
        if text == "(":
            atom = self.expansions()
            self.expect(")")
        elif text == "[":
            self.expansions()
            self.expect("]")
            atom = _Node("opt", [])
        elif kind in ("string", "regex", "special"):
            atom = _Node("term", [])
        elif kind == "name":
            atom = _Node("ref", [], text)
        else:
            raise _Unsupported(text)
        op = self.peek()
        if op in ("?", "*"):
            self.i += 1
            return _Node("opt", [])
        if op == "+":
            self.i += 1
        elif op == "~":
            self.i += 1
            low = self.tokens[self.i][1] if self.i < len(self.tokens) else ""
            self.i += 1
            if self.peek() == "..":
                self.i += 2
            if low == "0":
                return _Node("opt", [])
        return atom

    def expect(self, text: str) -> None:
        if self.peek() != text:
            raise _Unsupported(text)
        self.i += 1


def _rules(source: str) -> dict[str, _Node]:
    bodies: dict[str, str] = {}
    current: str | None = None
    for line in source.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("//"):
            continue
        if stripped.startswith("%"):
            if stripped.startswith(("%import", "%ignore", "%llguidance", "%declare")):
                for name in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", stripped.split(None, 1)[-1]):
                    bodies.setdefault(name, '"x"')  # imported or declared: assume it matches something
                current = None
                continue
            raise _Unsupported(stripped)
        match = _RULE_START.match(line)
        if match and not line[0].isspace():
            current = match.group(1)
            bodies[current] = line[match.end() :]
        elif current is not None:
            bodies[current] += "\n" + line
        else:
            raise _Unsupported(line)
    out: dict[str, _Node] = {}
    for name, body in bodies.items():
        parser = _Parser(_tokens(body))
        node = parser.expansions()
        if parser.peek() is not None:
            raise _Unsupported(body)
        out[name] = node
    return out


def _productive(node: _Node, known: set[str], rules: dict[str, _Node]) -> bool:
    if node.kind in ("term", "opt"):
        return True
    if node.kind == "ref":
        return node.name in known or node.name not in rules
    if node.kind == "seq":
        return all(_productive(child, known, rules) for child in node.children)
    return any(_productive(child, known, rules) for child in node.children)


def unproductive_start(source: str) -> str | None:
    """'start' when the grammar's start rule can never finish; None when it can (or we cannot tell)."""
    try:
        rules = _rules(source)
    except (_Unsupported, IndexError, RecursionError):
        return None
    if "start" not in rules:
        return None
    known: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, node in rules.items():
            if name not in known and _productive(node, known, rules):
                known.add(name)
                changed = True
    return None if "start" in known else "start"
