"""OpenAI's strict-mode JSON Schema subset: what `strict: true` accepts, checked before compiling.

Strict mode guarantees the output validates, so everything outside the subset the decoder
enforces exactly is refused (400) with the keyword and its location, rather than silently
approximated. The subset (OpenAI's structured-outputs documentation):

- the root is an object (not `anyOf`); every object lists all its properties in `required`
  and sets `additionalProperties: false`;
- types `object`, `array`, `string`, `number`, `integer`, `boolean`, `null` (a type list such as
  `["string", "null"]` is allowed), `enum`, `const`, `anyOf`, `$defs`/`definitions` with local `$ref`;
- strings: `pattern`, `format` (date-time, time, date, duration, email, hostname, ipv4, ipv6, uuid);
- numbers: `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`, `multipleOf`;
- arrays: `items`, `minItems`, `maxItems`;
- annotations `title`, `description`;
- at most 10 levels of nesting, 5,000 properties, 1,000 enum values in all.
"""

from __future__ import annotations

from typing import Any

MAX_DEPTH = 10
MAX_PROPERTIES = 5000
MAX_ENUM_VALUES = 1000

_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}
_FORMATS = {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
_COMMON = {"type", "enum", "const", "anyOf", "$ref", "$defs", "definitions", "title", "description"}
_BY_TYPE = {
    "object": {"properties", "required", "additionalProperties"},
    "array": {"items", "minItems", "maxItems"},
    "string": {"pattern", "format"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "boolean": set(),
    "null": set(),
}
_ALL_KNOWN = _COMMON.union(*_BY_TYPE.values())


class StrictSchemaError(ValueError):
    """The schema is outside the strict subset; `keyword` and `path` (a JSON pointer) say where."""

    def __init__(self, message: str, *, keyword: str, path: str) -> None:
        super().__init__(message)
        self.keyword = keyword
        self.path = path


def _pointer(path: tuple[str, ...]) -> str:
    return "#" + "".join("/" + part.replace("~", "~0").replace("/", "~1") for part in path)


class _Checker:
    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self.properties = 0
        self.enum_values = 0

    def fail(self, message: str, keyword: str, path: tuple[str, ...]) -> StrictSchemaError:
        where = _pointer(path)
        return StrictSchemaError(f"{message} (keyword '{keyword}' at '{where}')", keyword=keyword, path=where)

    def check(self, schema: Any, path: tuple[str, ...], depth: int) -> None:
        if not isinstance(schema, dict):
            raise self.fail("a schema must be a JSON object", "type", path)
        if depth > MAX_DEPTH:
            raise self.fail(f"schemas may nest at most {MAX_DEPTH} levels in strict mode", "properties", path)
        types = schema.get("type")
        type_list = [types] if isinstance(types, str) else types if isinstance(types, list) else None
        if types is not None and (not type_list or any(t not in _TYPES for t in type_list)):
            raise self.fail(f"'type' must be one of {sorted(_TYPES)} or a list of them", "type", path)
        allowed = set(_COMMON)
        for t in type_list or []:
            allowed |= _BY_TYPE[t]
        for keyword in schema:
            if keyword not in allowed:
                reason = (
                    f"'{keyword}' is not supported in strict mode"
                    if keyword not in _ALL_KNOWN
                    else f"'{keyword}' does not apply to type {types!r}"
                )
                raise self.fail(reason, keyword, path)
        if type_list is None and not any(k in schema for k in ("enum", "const", "anyOf", "$ref")):
            raise self.fail("every schema needs a 'type' (or enum, const, anyOf, $ref)", "type", path)
        if "$ref" in schema:
            ref = schema["$ref"]
            if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
                raise self.fail("only local references ('#/$defs/...') are supported", "$ref", path)
            self.resolve(ref, path)
        for key in ("$defs", "definitions"):
            defs = schema.get(key)
            if defs is not None:
                if not isinstance(defs, dict):
                    raise self.fail(f"'{key}' must be an object", key, path)
                for name, sub in defs.items():
                    self.check(sub, (*path, key, name), depth + 1)
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise self.fail("'enum' must be a non-empty list", "enum", path)
            self.enum_values += len(values)
            if self.enum_values > MAX_ENUM_VALUES:
                raise self.fail(f"at most {MAX_ENUM_VALUES} enum values in all", "enum", path)
        if "anyOf" in schema:
            options = schema["anyOf"]
            if not path:
                raise self.fail("the root schema must be an object, not anyOf", "anyOf", path)
            if not isinstance(options, list) or not options:
                raise self.fail("'anyOf' must be a non-empty list", "anyOf", path)
            for i, sub in enumerate(options):
                self.check(sub, (*path, "anyOf", str(i)), depth + 1)
        if "format" in schema and schema["format"] not in _FORMATS:
            raise self.fail(
                f"format {schema['format']!r} is not supported; use one of {sorted(_FORMATS)}", "format", path
            )
        if "pattern" in schema and not isinstance(schema["pattern"], str):
            raise self.fail("'pattern' must be a string", "pattern", path)
        if type_list and "object" in type_list:
            self.check_object(schema, path, depth)
        if type_list and "array" in type_list:
            if "items" not in schema:
                raise self.fail("arrays need 'items' in strict mode", "items", path)
            self.check(schema["items"], (*path, "items"), depth + 1)

    def check_object(self, schema: dict[str, Any], path: tuple[str, ...], depth: int) -> None:
        if schema.get("additionalProperties") is not False:
            raise self.fail("'additionalProperties' must be false in strict mode", "additionalProperties", path)
        props = schema.get("properties", {})
        if not isinstance(props, dict):
            raise self.fail("'properties' must be an object", "properties", path)
        required = schema.get("required", [])
        if not isinstance(required, list) or set(required) != set(props) or len(required) != len(set(required)):
            missing = sorted(set(props) - set(required if isinstance(required, list) else []))
            detail = f"; missing {missing}" if missing else ""
            raise self.fail(
                f"'required' must list every property exactly once in strict mode{detail}", "required", path
            )
        self.properties += len(props)
        if self.properties > MAX_PROPERTIES:
            raise self.fail(f"at most {MAX_PROPERTIES} properties in all", "properties", path)
        for name, sub in props.items():
            self.check(sub, (*path, "properties", name), depth + 1)

    def resolve(self, ref: str, path: tuple[str, ...]) -> None:
        node: Any = self.root
        for part in ref[2:].split("/") if ref != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                raise self.fail(f"reference {ref!r} does not resolve", "$ref", path)
            node = node[part]


def check_strict_schema(schema: Any) -> None:
    """Raise StrictSchemaError unless `schema` is inside OpenAI's strict subset."""
    if not isinstance(schema, dict):
        raise StrictSchemaError("the schema must be a JSON object", keyword="type", path="#")
    if schema.get("type") != "object":
        raise StrictSchemaError(
            "the root schema must be of type 'object' in strict mode (keyword 'type' at '#')", keyword="type", path="#"
        )
    _Checker(schema).check(schema, (), 0)
