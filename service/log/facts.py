"""The facts of a run's log (`run_facts`), one frozen dataclass per kind, and the one codec that stores them.

A fact row is (`kind`, `data`): `data` is a JSON object, never sent to clients. What the run loop needs to
resume a run and what the read models are rebuilt from is here (docs/durability.md has the table):

| kind | type | written by |
| --- | --- | --- |
| `request` | `RequestFact` (with `Sampling`, `ApprovedCall`) | `commands.create`, in the create transaction |
| `tokens` | `TokensFact` | every group commit (`store/token_facts.py` keeps them in chunk rows) |
| `tool_call_started` / `tool_call_result` | `ToolCallStarted` / `ToolCallResult` | the agent loop (`agent/calls.py`) |
| `cancel_requested` | `CancelRequested` | `recorder.cancel` |
| `token_record` | `TokenRecord` | the stream archive, after the replay window |
| `not_compactable` | `NotCompactable` | the stream archive, for a stream it leaves as it is |

The codec (`fact_data`, `encode_fact`, `decode_fact`, `decode_as`) writes exactly the JSON the code wrote
before these types existed, byte for byte (tests/test_log_facts.py decodes and re-encodes a log written
through the real service): keys in field order, compact separators, no ASCII escaping, and each field's
rule for when its key is left out, stated in the field's metadata:
- *always written* (no rule): `null` when the value is None;
- *omitted when None* (`_omitted_when_none`): the key appears only with a value;
- *omitted when empty* (`_omitted_when_empty`): the key appears only with a non-empty value.

Decoding reads keys by name in any order. A key this version does not know is ignored (a newer replica's),
as the readers of plain dicts did; a key an older version did not write yet takes its field's default: the
value those readers assumed (`logprobs` False, penalties 0.0, None for the rest). Such a row would be
re-encoded with the key, but rows are rewritten only by merging `tokens` facts, whose keys never changed.

Values are the JSON the row holds (lists, dicts): a fact is frozen, and nobody mutates what it holds.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, ClassVar, Literal, TypeVar

_OMIT = "omit"  # field metadata: a predicate on the value; true -> the key is left out
_NESTED = "nested"  # field metadata: the dataclass a JSON object value is decoded into


def _none(value: object) -> bool:
    return value is None


def _empty(value: object) -> bool:
    return not value


def _omitted_when_none() -> Any:
    """A field whose key is written only when its value is not None (None when the key is absent)."""
    return field(default=None, metadata={_OMIT: _none})


def _omitted_when_empty() -> Any:
    """A field whose key is written only when its value is not empty (None when the key is absent)."""
    return field(default=None, metadata={_OMIT: _empty})


class MalformedFact(ValueError):
    """A row that is not a fact of its kind: a required key is missing, or the kind is unknown."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Sampling:
    """How a run samples (`RequestFact.sampling`); with the seed, a resumed run draws the same tokens."""

    max_new_tokens: int  # the output budget of the whole run, every segment of a tool loop included
    temperature: float
    top_p: float
    seed: int
    top_logprobs: int
    frequency_penalty: float = 0.0  # 0.0 in rows older than penalties
    presence_penalty: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovedCall:
    """An MCP call the request's `mcp_approval_response` approves (`RequestFact.approved_call`): the run starts
    with it, as the model's own call."""

    server_label: str
    name: str
    arguments: str
    approval_request_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestFact:
    """Everything a run is rebuilt from besides its tokens: logged once, in the create transaction."""

    KIND: ClassVar[str] = "request"

    request: dict[str, Any]  # the create request as validated (MCP secrets redacted)
    response: dict[str, Any]  # the Response as created (the `response.created` snapshot)
    prompt_items: list[dict[str, Any]]  # the whole chain the prompt was rendered from (history, then input)
    instructions: str | None
    tools: list[Any]  # the tools the model was shown (server tools in their namespaces)
    constraints: dict[str, Any] | None = _omitted_when_none()  # service/constraints/plan.py; absent in old rows
    reasoning_effort: Literal["low", "medium", "high"]
    prompt_token_ids: list[int]
    input_item_count: int  # the request's own input items, the last of `prompt_items`
    conversation_id: str | None = _omitted_when_none()
    # The input items when `truncation: auto` dropped some of them from `prompt_items` (for the projections).
    input_items: list[dict[str, Any]] | None = _omitted_when_none()
    # Server-side tools (service/agent/setup.py): new `mcp_list_tools` items, an approved call, MCP headers
    # sealed for a background run (by label), and the labels whose headers a run has in memory (names only).
    mcp_listed: list[dict[str, Any]] | None = _omitted_when_empty()
    approved_call: ApprovedCall | None = field(default=None, metadata={_OMIT: _none, _NESTED: ApprovedCall})
    sealed_secrets: dict[str, str] | None = _omitted_when_empty()
    mcp_secret_labels: list[str] | None = _omitted_when_empty()
    compaction_item: dict[str, Any] | None = _omitted_when_none()  # a `context_management` compaction's item
    store: bool
    project: str | None = _omitted_when_none()  # the owner; None in rows older than projects (the default)
    logprobs: bool = False  # the response's text deltas carry logprobs
    sampling: Sampling = field(metadata={_NESTED: Sampling})

    @property
    def background(self) -> bool:
        return bool(self.request.get("background"))

    @property
    def max_tool_calls(self) -> int | None:
        limit: int | None = (self.constraints or {}).get("max_tool_calls")
        return limit


@dataclass(frozen=True, slots=True, kw_only=True)
class TokensFact:
    """Sampled token ids, in order. A run's `tokens` facts concatenated are every id it sampled (chunking, see
    store/token_facts.py, does not change the concatenation)."""

    KIND: ClassVar[str] = "tokens"

    ids: list[int]
    # One entry per id (None for ids sampled without them), when any id of the fact has logprobs.
    logprobs: list[Any] | None = _omitted_when_none()
    # The ids of engine steps committed together, as group sizes, when any group holds more than one id
    # (their text deltas were folded into one event: StreamBuilder.fold_into; replay folds the same groups).
    groups: list[int] | None = _omitted_when_none()

    def group_sizes(self) -> list[int]:
        """How the ids were grouped when their events were built (groups of one when `groups` is absent)."""
        return list(self.groups) if self.groups else [1] * len(self.ids)

    @classmethod
    def merge(cls, facts: Sequence[TokensFact]) -> TokensFact:
        """One fact equal, for replay, to the sequence of `facts`."""
        ids = [token for fact in facts for token in fact.ids]
        logprobs = None
        if any(fact.logprobs is not None for fact in facts):
            logprobs = [
                entry
                for fact in facts
                for entry in (fact.logprobs if fact.logprobs is not None else [None] * len(fact.ids))
            ]
        groups = [size for fact in facts for size in fact.group_sizes()]
        return cls(ids=ids, logprobs=logprobs, groups=groups if any(size > 1 for size in groups) else None)

    def join_last_group(self, later: TokensFact) -> TokensFact:
        """This fact with the ids of `later` (one step's fact) added to its last group."""
        sizes = self.group_sizes()
        return replace(TokensFact.merge([self, later]), groups=sizes[:-1] + [sizes[-1] + len(later.ids)])


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallStarted:
    """Logged (committed) before a server-side tool call leaves this process."""

    KIND: ClassVar[str] = "tool_call_started"

    index: int  # the run's calls in order, from 0
    namespace: str  # the MCP server's label, or `python` (the code interpreter)
    name: str
    arguments: str
    idempotency_key: str  # the same when a call cut off by a crash is made again


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallResult:
    """What a server-side tool call returned (or the error the model is shown); a logged result is reused."""

    KIND: ClassVar[str] = "tool_call_result"

    index: int
    output: str | None = None
    error: str | None = None
    details: dict[str, Any] | None = _omitted_when_empty()  # tool-specific extras (the interpreter's logs)


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelRequested:
    """A client cancelled the run; its owner ends it at its next fenced commit."""

    KIND: ClassVar[str] = "cancel_requested"


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenRecord:
    """A finished response's `tokens` facts merged into one, zlib-compressed and base64-encoded: written when the
    stream archive replaces its regenerable events (service/stream_archive.py)."""

    KIND: ClassVar[str] = "token_record"

    zlib: str


@dataclass(frozen=True, slots=True, kw_only=True)
class NotCompactable:
    """A finished response whose events do not all regenerate from its tokens: its stream is kept as it is."""

    KIND: ClassVar[str] = "not_compactable"


Fact = RequestFact | TokensFact | ToolCallStarted | ToolCallResult | CancelRequested | TokenRecord | NotCompactable
FACT_TYPES: dict[str, type[Fact]] = {
    cls.KIND: cls
    for cls in (RequestFact, TokensFact, ToolCallStarted, ToolCallResult, CancelRequested, TokenRecord, NotCompactable)
}

_Encodable = Fact | Sampling | ApprovedCall
F = TypeVar("F", bound=_Encodable)


@dataclass(frozen=True, slots=True)
class _Rule:
    name: str
    omit: Callable[[object], bool] | None
    nested: type[_Encodable] | None
    required: bool


_RULES: dict[type[Any], tuple[_Rule, ...]] = {}  # by dataclass: every fact type, and Sampling


def _rules(cls: type[Any]) -> tuple[_Rule, ...]:
    """Each field of `cls`, in key order, with its codec rule."""
    rules = _RULES.get(cls)
    if rules is None:
        rules = _RULES[cls] = tuple(
            _Rule(
                f.name,
                f.metadata.get(_OMIT),
                f.metadata.get(_NESTED),
                f.default is MISSING and f.default_factory is MISSING,
            )
            for f in fields(cls)
        )
    return rules


def fact_data(fact: _Encodable) -> dict[str, Any]:
    """The JSON object `fact` is stored as (keys in field order, each field's omission rule applied)."""
    data: dict[str, Any] = {}
    for rule in _rules(type(fact)):
        value = getattr(fact, rule.name)
        if rule.omit is not None and rule.omit(value):
            continue
        data[rule.name] = fact_data(value) if rule.nested is not None and value is not None else value
    return data


def encode_json(data: Mapping[str, Any]) -> str:
    """A fact's JSON object as `run_facts.data` stores it."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def encode_fact(fact: Fact) -> str:
    """`run_facts.data` for `fact`, byte for byte what the dict-building code stored."""
    return encode_json(fact_data(fact))


def decode_as(cls: type[F], data: str | Mapping[str, Any]) -> F:
    """A stored fact (its `run_facts.data`, or that JSON parsed) as `cls`; raises MalformedFact."""
    parsed: Mapping[str, Any] = json.loads(data) if isinstance(data, str) else data
    if not isinstance(parsed, Mapping):
        raise MalformedFact(f"a {cls.__name__} is a JSON object, not {type(parsed).__name__}")
    values: dict[str, Any] = {}
    for rule in _rules(cls):
        if rule.name in parsed:
            value = parsed[rule.name]
            values[rule.name] = value if rule.nested is None or value is None else decode_as(rule.nested, value)
        elif rule.required:
            raise MalformedFact(f"a {cls.__name__} without `{rule.name}`")
    return cls(**values)


def decode_fact(kind: str, data: str | Mapping[str, Any]) -> Fact:
    """A stored fact of any kind as its dataclass; raises MalformedFact (an unknown kind included)."""
    cls = FACT_TYPES.get(kind)
    if cls is None:
        raise MalformedFact(f"no fact kind {kind!r}")
    return decode_as(cls, data)
