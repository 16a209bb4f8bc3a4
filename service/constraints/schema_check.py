"""Static checks on schemas and regexes that llguidance accepts but a run could not live with.

`unproductive_ref`: is a JSON schema's language empty because it recurses without end? llguidance
refuses unsatisfiable leaves (`minimum` above `maximum`, `enum: []`, a pattern against a length)
but accepts `{"properties": {"n": {"$ref": "#"}}, "required": ["n"]}`, whose every value must
contain another: a run constrained by it writes `{"n": {"n": ...` until it hits its token limit. A
schema node is *productive* when some finite value matches it; this is the fixpoint over `$ref`s,
like lark_check's over rules. What it does not understand counts as productive (never a false 400).

`max_repetition`: how long a regex is once its `{m,n}` counts are unrolled (nested counts multiplied).
llguidance's cost for `a{N}` grows with N squared and is not bounded by its fuel limits (`a{40000}`:
~1 s a mask, `a{1000000}`: 41 s to build), so such regexes are refused before llguidance sees them.
"""

from __future__ import annotations

import re
from typing import Any

_MAX_DEPTH = 200  # deeper schemas are not walked (llguidance refuses far shallower ones)
_QUANTIFIER = re.compile(r"\{(\d+)(?:,(\d*))?\}")


def unproductive_ref(schema: Any) -> str | None:
    """The first `$ref` (as written) through which the root can never finish, or None when some finite value
    matches (or we cannot tell)."""
    refs: dict[str, Any] = {}
    _collect_refs(schema, schema, refs, 0)
    known: set[str] = set()
    changed = True
    while changed:
        changed = False
        for ref, target in refs.items():
            if ref not in known and _productive(target, known, refs, 0):
                known.add(ref)
                changed = True
    if _productive(schema, known, refs, 0):
        return None
    return next((ref for ref in refs if ref not in known), "#")


def _resolve(root: Any, ref: str) -> tuple[bool, Any]:
    if ref == "#":
        return True, root
    if not ref.startswith("#/"):
        return False, None
    node = root
    for raw in ref[2:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False, None
    return True, node


def _collect_refs(root: Any, node: Any, refs: dict[str, Any], depth: int) -> None:
    if depth > _MAX_DEPTH:
        return
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref not in refs:
            found, target = _resolve(root, ref)
            if found:
                refs[ref] = target
                _collect_refs(root, target, refs, depth + 1)
        for value in node.values():
            _collect_refs(root, value, refs, depth + 1)
    elif isinstance(node, list):
        for value in node:
            _collect_refs(root, value, refs, depth + 1)


def _productive(node: Any, known: set[str], refs: dict[str, Any], depth: int) -> bool:
    if depth > _MAX_DEPTH or not isinstance(node, dict):
        return True
    ref = node.get("$ref")
    if isinstance(ref, str) and ref in refs and ref not in known:
        return False
    for key in ("anyOf", "oneOf"):
        options = node.get(key)
        if (
            isinstance(options, list)
            and options
            and not any(_productive(option, known, refs, depth + 1) for option in options)
        ):
            return False
    parts = node.get("allOf")
    if isinstance(parts, list) and not all(_productive(part, known, refs, depth + 1) for part in parts):
        return False
    types = node.get("type")
    type_set = set(types) if isinstance(types, list) else {types}
    if types is not None and type_set - {"object", "array"}:
        return True  # a primitive alternative always finishes (llguidance checks its own constraints)
    return _object_productive(node, known, refs, depth) and _array_productive(node, known, refs, depth)


def _object_productive(node: dict[str, Any], known: set[str], refs: dict[str, Any], depth: int) -> bool:
    properties, required = node.get("properties"), node.get("required")
    if not isinstance(properties, dict) or not isinstance(required, list):
        return True
    return all(
        _productive(properties[name], known, refs, depth + 1)
        for name in required
        if isinstance(name, str) and name in properties
    )


def _array_productive(node: dict[str, Any], known: set[str], refs: dict[str, Any], depth: int) -> bool:
    min_items = node.get("minItems", 0)
    if not isinstance(min_items, int) or min_items <= 0:
        return True
    prefix = node.get("prefixItems")
    prefix = prefix if isinstance(prefix, list) else []
    needed = prefix[:min_items]
    if min_items > len(prefix) and "items" in node:
        needed.append(node["items"])
    return all(_productive(item, known, refs, depth + 1) for item in needed)


def max_repetition(regex: str) -> int:
    """How long `regex` is once its counted repetitions are unrolled (`a{3}b` is 4, `(ab){3}` 6, nested counts
    multiplied, alternatives added): what llguidance's lexer expands. `*`/`+`/`?` do not unroll."""
    stack: list[list[int]] = [[0, 0]]  # per open group: [size of the atoms before the last, size of the last]
    i, n = 0, len(regex)
    while i < n:
        c = regex[i]
        frame = stack[-1]
        if c == "\\":
            i += 2
            if i < n and regex[i - 1] in "pPxu" and regex[i] == "{":
                i = regex.find("}", i) + 1 or n
            frame[0], frame[1] = frame[0] + frame[1], 1
            continue
        if c == "[":
            i = _class_end(regex, i)
            frame[0], frame[1] = frame[0] + frame[1], 1
            continue
        if c == "(":
            stack.append([0, 0])
        elif c == ")" and len(stack) > 1:
            inner = sum(stack.pop())
            stack[-1][0], stack[-1][1] = stack[-1][0] + stack[-1][1], inner
        elif c == "{" and _QUANTIFIER.match(regex, i):
            match = _QUANTIFIER.match(regex, i)
            assert match is not None
            frame[1] *= max(int(match.group(1)), int(match.group(2) or 0), 1)
            i = match.end()
            continue
        elif c == "|":
            frame[0], frame[1] = frame[0] + frame[1], 0
        elif c not in "*+?^$":
            frame[0], frame[1] = frame[0] + frame[1], 1
        i += 1
    while len(stack) > 1:
        inner = sum(stack.pop())
        stack[-1][1] += inner
    return sum(stack[0])


def _class_end(regex: str, start: int) -> int:
    """The index after the `]` closing the character class opened at `start` (nested classes included)."""
    depth, i = 0, start
    while i < len(regex):
        c = regex[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            depth += 1
        elif c == "]" and i > start + 1 and regex[i - 1] != "[":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return len(regex)


def schema_patterns(schema: Any, depth: int = 0) -> list[str]:
    """Every regex a JSON schema holds (`pattern`, `patternProperties` keys)."""
    out: list[str] = []
    if depth > _MAX_DEPTH:
        return out
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "pattern" and isinstance(value, str):
                out.append(value)
            elif key == "patternProperties" and isinstance(value, dict):
                out.extend(k for k in value if isinstance(k, str))
                out.extend(p for v in value.values() for p in schema_patterns(v, depth + 1))
            else:
                out.extend(schema_patterns(value, depth + 1))
    elif isinstance(schema, list):
        for value in schema:
            out.extend(schema_patterns(value, depth + 1))
    return out


_LARK_REGEX = re.compile(r'"(?:[^"\\]|\\.)*"|/((?:[^/\\\n]|\\.)+)/')
_LARK_REPEAT = re.compile(r"~\s*(\d+)(?:\s*\.\.\s*(\d+))?")


def lark_repetition(source: str) -> int:
    """How much a Lark grammar's counted repetitions unroll: its regex terminals' (`/a{50}/`, see max_repetition)
    and `item ~ n..m` counts, added up."""
    total = 0
    for match in _LARK_REGEX.finditer(source):
        if match.group(1) is not None:
            total += max_repetition(match.group(1))
    for match in _LARK_REPEAT.finditer(source):
        total += max(int(match.group(1)), int(match.group(2) or 0))
    return total
