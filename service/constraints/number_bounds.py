"""A bound on the integers a schema leaves open, so that a model cannot write digits without end.

A weak model under a JSON schema whose integer has no bound may keep choosing another digit until
max_output_tokens (the built-in model wrote 40- to 5,700-digit integers into tool arguments). Where a schema
leaves an integer's size open (no minimum/maximum on a side, no enum or const), the decoder allows at most
`digits` digits there: ±(10**digits - 1). `digits` is chosen per request (request_integer_digits): at least
DEFAULT_INTEGER_DIGITS, and as many as the longest number the request itself holds, so a number the client
sent can always be copied (past MAX_BOUNDED_DIGITS, no bound at all). A bound the schema states is never
changed; numbers (`"type": "number"`) and schemas that allow any JSON value are not bounded."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

# 12 digits: every integer under a trillion; a millisecond timestamp (13 digits) needs the request to hold one.
DEFAULT_INTEGER_DIGITS = 12
# The widest bound written: ±(10**15 - 1) is exact as a float64, which is how llguidance reads a schema's bounds
# (and it refuses integers past 64 bits). A request holding a longer number gets no bound at all.
MAX_BOUNDED_DIGITS = 15
_DIGIT_RUN = re.compile(r"\d+")
# Keywords whose value is one subschema, a list of them, or a map of names to them (JSON Schema 2020-12 and
# draft 7's spellings).
_ONE = ("items", "additionalProperties", "not", "contains", "if", "then", "else", "propertyNames")
_MANY = ("prefixItems", "anyOf", "oneOf", "allOf")
_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_LOWER = ("minimum", "exclusiveMinimum")
_UPPER = ("maximum", "exclusiveMaximum")


def request_integer_digits(texts: Iterable[str]) -> int | None:
    """The digits an open integer may have for a request whose text (instructions, input, tools) is `texts`;
    None (no bound) when the request holds a number longer than MAX_BOUNDED_DIGITS."""
    longest = max((len(run) for text in texts for run in _DIGIT_RUN.findall(text)), default=0)
    return None if longest > MAX_BOUNDED_DIGITS else max(DEFAULT_INTEGER_DIGITS, longest)


def bound_open_integers(schema: Any, digits: int) -> Any:
    """`schema` with every integer whose size it leaves open bounded to `digits` digits (a copy; the input is
    not changed)."""
    if isinstance(schema, list):  # a draft-7 tuple `items`
        return [bound_open_integers(s, digits) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _ONE:
        if key in out:
            out[key] = bound_open_integers(out[key], digits)
    for key in _MANY:
        if isinstance(out.get(key), list):
            out[key] = [bound_open_integers(s, digits) for s in out[key]]
    for key in _MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: bound_open_integers(s, digits) for name, s in out[key].items()}
    limit = 10**digits - 1
    if _allows_integers(out) and "enum" not in out and "const" not in out and not _stated_past(out, limit):
        if not any(k in out for k in _LOWER):
            out["minimum"] = -limit
        if not any(k in out for k in _UPPER):
            out["maximum"] = limit
    return out


def _stated_past(schema: dict[str, Any], limit: int) -> bool:
    """Whether a bound the schema states lies past ±limit (`"minimum": 1e20`): a bound added on the other side
    would leave no integer at all, so such an integer is left as the schema says."""
    stated = [schema[k] for k in (*_LOWER, *_UPPER) if k in schema]
    return any(isinstance(v, int | float) and not isinstance(v, bool) and abs(v) >= limit for v in stated)


def _allows_integers(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    return kind == "integer" or (isinstance(kind, list) and "integer" in kind and "number" not in kind)
