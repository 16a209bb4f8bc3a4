"""What a request allows the model to write, independent of the chat format.

`constraint_spec` turns a request into a small JSON fact (logged with the request, so a resumed
run rebuilds the same constraint even if settings changed); `plan_from_spec` turns that fact and
the request's tools into a DecodingPlan, which a chat format's constraint enforces; `check_plan`
compiles every grammar of a plan at request time, so bad schemas and grammars are a 400.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import llguidance

from service.constraints.compiler import (
    COMPILE_BUDGET_S,
    DEFAULT_MAX_GRAMMAR_BYTES,
    CompiledGrammar,
    GrammarError,
    GrammarSpec,
    GrammarTooComplex,
    compile_grammar,
)
from service.errors import InvalidRequest

_ANY_OBJECT: dict[str, Any] = {"type": "object"}
# The code interpreter's call target; "@" keeps it apart from a function tool named "python".
PYTHON_TARGET = "@python"
_NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}, "required": [], "additionalProperties": False}


@dataclass(frozen=True)
class CallTarget:
    name: str
    custom: bool  # a custom tool: free-text or grammar input (no `<|constrain|>json`)
    grammar: GrammarSpec | None  # the body's grammar; None = free text
    param: str  # where the grammar came from, for errors (e.g. "tools[0].parameters")
    # Non-strict function parameters are followed as far as they compile; otherwise any JSON object.
    fallback: GrammarSpec | None = None


@dataclass(frozen=True)
class DecodingPlan:
    calls: tuple[CallTarget, ...] = ()  # tools the model may call now
    final: bool = True  # it may answer (not only call)
    final_grammar: GrammarSpec | None = None  # text.format of the answer
    final_param: str = "text.format.schema"
    reasoning_budget: int | None = None  # analysis/preamble tokens before the answer is forced

    @property
    def constrains_content(self) -> bool:
        """Beyond well-formed free text: a forced or restricted choice, or a grammar somewhere."""
        return (
            not self.final
            or self.final_grammar is not None
            or any(call.custom or (call.grammar is not None and call.grammar.strict) for call in self.calls)
        )


def constraint_spec(
    *,
    tool_choice: Any,
    text_format: dict[str, Any] | None,
    max_tool_calls: int | None,
    reasoning_budget: int,
    integer_digits: int | None = None,
) -> dict[str, Any]:
    """The JSON fact a run's constraint is rebuilt from (with the run's tools). `integer_digits`: the digits an
    integer that a schema leaves open may have (constraints/number_bounds.py); facts logged before it have none,
    and their runs resume unbounded, as they started."""
    return {
        "tool_choice": tool_choice,
        "text_format": text_format,
        "max_tool_calls": max_tool_calls,
        "reasoning_budget": reasoning_budget,
        "integer_digits": integer_digits,
    }


def _call_target(index: int, tool: dict[str, Any], digits: int | None = None) -> CallTarget:
    if tool.get("type") == "python":  # the code interpreter: plain code, addressed as `python`
        limit = tool.get("max_code_chars")
        grammar = GrammarSpec("regex", f"(?s:.{{0,{int(limit)}}})") if limit else None
        return CallTarget(PYTHON_TARGET, True, grammar, f"tools[{index}]")
    if tool.get("type") == "mcp_function":  # an MCP server's tool, addressed as `LABEL.NAME`
        params = tool.get("parameters") or _ANY_OBJECT
        if params.get("type") == "object" and "additionalProperties" not in params:
            # The server declared its parameters: a well-formed call names no others.
            params = {**params, "additionalProperties": False}
        qualified = f"{tool['namespace']}.{tool['name']}"
        return CallTarget(
            qualified, False, GrammarSpec.json_schema(params, strict=False, integer_digits=digits),
            f"tools[{index}].parameters",
            GrammarSpec.json_schema(_ANY_OBJECT, strict=False),
        )  # fmt: skip
    if tool.get("type") == "custom":
        fmt = tool.get("format") or {"type": "text"}
        grammar = GrammarSpec(fmt["syntax"], fmt["definition"]) if fmt.get("type") == "grammar" else None
        return CallTarget(tool["name"], True, grammar, f"tools[{index}].format.definition")
    strict = bool(tool.get("strict"))
    params = tool.get("parameters") or (_NO_ARGUMENTS if strict else _ANY_OBJECT)
    grammar = GrammarSpec.json_schema(params, strict=strict, integer_digits=digits)
    fallback = None if strict else GrammarSpec.json_schema(_ANY_OBJECT, strict=False)
    return CallTarget(tool["name"], False, grammar, f"tools[{index}].parameters", fallback)


def plan_from_spec(tools: list[dict[str, Any]], spec: dict[str, Any] | None) -> DecodingPlan:
    spec = spec or {}
    choice = spec.get("tool_choice", "auto")
    digits = spec.get("integer_digits")
    targets = [_call_target(i, tool, digits) for i, tool in enumerate(tools)]
    final = True
    if choice == "none" or spec.get("max_tool_calls") == 0:
        targets = []
    elif choice == "required":
        final = False
    elif isinstance(choice, dict):
        if choice.get("type") == "allowed_tools":
            names = {ref["name"] for ref in choice.get("tools", [])}
            final = choice.get("mode") != "required"
        elif choice.get("type") == "mcp":  # one tool of the server, or any of them
            prefix = f"{choice['server_label']}."
            names = {
                t.name
                for t in targets
                if t.name.startswith(prefix) and choice.get("name") in (None, t.name[len(prefix) :])
            }
            final = False
        else:
            names = {choice["name"]}
            final = False
        targets = [t for t in targets if t.name in names]
    if not targets:
        final = True  # nothing to call: the model answers
    fmt = spec.get("text_format") or {}
    final_grammar: GrammarSpec | None = None
    if fmt.get("type") == "json_schema":
        strict = bool(fmt.get("strict"))
        final_grammar = GrammarSpec.json_schema(fmt.get("schema"), strict=strict, integer_digits=digits)
    elif fmt.get("type") == "json_object":
        final_grammar = GrammarSpec.json_schema(_ANY_OBJECT, strict=False)
    return DecodingPlan(tuple(targets), final, final_grammar, "text.format.schema", spec.get("reasoning_budget"))


def compile_target(target: CallTarget, tokenizer: llguidance.LLTokenizer) -> CompiledGrammar | None:
    """The grammar a call's body follows (its fallback when the non-strict schema does not compile)."""
    if target.grammar is None:
        return None
    try:
        return compile_grammar(target.grammar, tokenizer, max_bytes=1 << 62)  # size checked at create
    except GrammarError:
        if target.fallback is None:
            raise
        return compile_grammar(target.fallback, tokenizer)


def check_plan(
    plan: DecodingPlan, tokenizer: llguidance.LLTokenizer, *, max_bytes: int = DEFAULT_MAX_GRAMMAR_BYTES
) -> None:
    """Compile every grammar of the plan (cached); a bad one is a 400 naming where it came from."""
    grammars = [(plan.final_grammar, plan.final_param, None)] + [(c.grammar, c.param, c.fallback) for c in plan.calls]
    for grammar, param, fallback in grammars:
        if grammar is None:
            continue
        try:
            compile_grammar(grammar, tokenizer, max_bytes=max_bytes, budget_s=COMPILE_BUDGET_S)
        except GrammarError as exc:
            if fallback is not None:
                compile_grammar(fallback, tokenizer)
                continue
            code = "grammar_too_large" if "at most" in str(exc) and "bytes" in str(exc) else "invalid_grammar"
            if param.endswith("schema") or param.endswith("parameters"):
                code = "invalid_json_schema" if code == "invalid_grammar" else code
            if isinstance(exc, GrammarTooComplex):
                code = "grammar_too_complex"
            raise InvalidRequest(str(exc), param=param, code=code) from None
