"""The log's facts as types (service/log/facts.py): a log written by the service (real app in process, real
database on each backend, the random model, a real MCP server) decodes into the dataclasses and re-encodes byte
for byte, every row; the codec round-trips generated facts of every kind; and it writes what the dict-building
code it replaced wrote (the request fact's conditional keys, the token facts' merges)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from cryptography.fernet import Fernet
from hypothesis import given, settings
from hypothesis import strategies as st

from service.app import create_app
from service.config import Settings
from service.log import facts
from service.log.facts import (
    FACT_TYPES,
    ApprovedCall,
    CancelRequested,
    MalformedFact,
    NotCompactable,
    RequestFact,
    Sampling,
    TokenRecord,
    TokensFact,
    ToolCallResult,
    ToolCallStarted,
    decode_as,
    decode_fact,
    encode_fact,
    fact_data,
)
from service.store.db import create_engine
from service.store.schema import DEFAULT_PROJECT, run_facts
from tests.conftest import MODEL_CACHE
from tests.test_tools_mcp import McpServer, mcp_server  # noqa: F401 (fixture)

SECRET = "sk-LOG-FACTS-SECRET"
SECRET_KEY = Fernet.generate_key().decode()


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# ---------------------------------------------------------------------------------------------------------
# A log written by the service, decoded and re-encoded row by row.


@contextlib.asynccontextmanager
async def _service(database_url: str, model: Path, monkeypatch: pytest.MonkeyPatch, **env: str) -> AsyncIterator[Any]:
    """The real app in process (its lifespan: migrations, model, supervisor, sweeper) and a client on it."""
    base = {
        "SERVICE_DATABASE_URL": database_url,
        "SERVICE_MODEL_CACHE": str(MODEL_CACHE),
        "SERVICE_MODEL": str(model),
        "SERVICE_INTRA_OP_THREADS": "1",
        "SERVICE_SECRET_KEY": SECRET_KEY,  # a background run's MCP headers are sealed in its request fact
        # A short reasoning budget: the random model's free text is cut after a few tokens, so a forced call comes.
        "SERVICE_REASONING_TOKENS_LOW": "6",
        "SERVICE_REASONING_TOKENS_MEDIUM": "6",
        # Steps committed a few at a time: `tokens` facts with `groups`.
        "SERVICE_COMMIT_INTERVAL_SECONDS": "0.05",
    }
    for name, value in {**base, **env}.items():
        monkeypatch.setenv(name, value)
    app = create_app(Settings.from_env())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=120) as client:
            yield client


async def _create(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    reply = await client.post("/v1/responses", json=body)
    assert reply.status_code == 200, reply.text
    created: dict[str, Any] = reply.json()
    return created


async def _terminal(client: httpx.AsyncClient, response_id: str) -> dict[str, Any]:
    for _ in range(1200):
        response: dict[str, Any] = (await client.get(f"/v1/responses/{response_id}")).json()
        if response["status"] in ("completed", "incomplete", "failed", "cancelled"):
            return response
        await asyncio.sleep(0.05)
    raise AssertionError(f"{response_id} did not finish")


async def _rows(database_url: str) -> list[tuple[str, str]]:
    db = create_engine(database_url)
    try:
        async with db.connect() as connection:
            query = sa.select(run_facts.c.kind, run_facts.c.data).order_by(run_facts.c.position)
            return [(kind, data) for kind, data in await connection.execute(query)]
    finally:
        await db.dispose()


def _assert_rows_reencode(rows: list[tuple[str, str]]) -> list[facts.Fact]:
    decoded = []
    for kind, data in rows:
        fact = decode_fact(kind, data)
        assert kind == fact.KIND
        assert encode_fact(fact) == data, (kind, data)
        decoded.append(fact)
    return decoded


async def test_a_log_written_by_the_service_reencodes_byte_for_byte(
    database_url: str,
    random_model_dir: Path,
    mcp_server: McpServer,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mcp = {"type": "mcp", "server_label": "counter", "server_url": mcp_server.url, "require_approval": "never"}
    force = {"type": "mcp", "server_label": "counter", "name": "pick"}
    async with _service(database_url, random_model_dir, monkeypatch) as client:
        # Tokens with logprobs, folded into groups.
        await _create(
            client, input="hello", max_output_tokens=24, include=["message.output_text.logprobs"], top_logprobs=2
        )
        # A background MCP call with a secret: listing, sealed headers, the call's started and result facts.
        called = await _create(
            client,
            input="add two numbers",
            tools=[{**mcp, "authorization": SECRET}],
            tool_choice=force,
            max_tool_calls=1,
            max_output_tokens=120,
            background=True,
            seed=7,
        )
        assert any(item["type"] == "mcp_call" for item in (await _terminal(client, called["id"]))["output"])
        # An approval asked, then approved: the request fact of the second turn holds the approved call.
        asking = {**mcp, "require_approval": "always"}
        asked = await _create(client, input="pick", tools=[asking], tool_choice=force, max_output_tokens=80)
        request = asked["output"][-1]
        assert request["type"] == "mcp_approval_request", asked["output"]
        approval = {"type": "mcp_approval_response", "approval_request_id": request["id"], "approve": True}
        await _create(client, previous_response_id=asked["id"], input=[approval], tools=[asking], max_output_tokens=40)
        # A conversation's turn.
        conversation = (await client.post("/v1/conversations", json={})).json()
        await _create(client, input="one", conversation=conversation["id"], max_output_tokens=4)
        # A cancelled background run.
        long = await _create(client, input="go on", background=True, max_output_tokens=3000)
        reply = await client.post(f"/v1/responses/{long['id']}/cancel")
        assert reply.status_code == 200, reply.text
        await _terminal(client, long["id"])
    written = _assert_rows_reencode(await _rows(database_url))
    assert {fact.KIND for fact in written} == {"request", "tokens", "tool_call_started", "tool_call_result"} | {
        "cancel_requested"
    }
    requests = [fact for fact in written if isinstance(fact, RequestFact)]
    assert any(fact.sealed_secrets and fact.mcp_secret_labels == ["counter"] for fact in requests)
    assert any(fact.mcp_listed for fact in requests) and any(fact.approved_call for fact in requests)
    assert any(fact.conversation_id == conversation["id"] for fact in requests)
    assert all(fact.project == DEFAULT_PROJECT and fact.constraints is not None for fact in requests)
    tokens = [fact for fact in written if isinstance(fact, TokensFact)]
    assert any(fact.logprobs for fact in tokens) and any(fact.groups for fact in tokens)
    assert SECRET not in "".join(data for _, data in await _rows(database_url))

    # After the replay window the stream archive replaces regenerable streams' tokens by a record, and marks
    # the others (a tool loop's) as not compactable.
    archiving = {"SERVICE_REPLAY_WINDOW_SECONDS": "0", "SERVICE_LOG_COMPACTION_GRACE_SECONDS": "0"}
    async with _service(
        database_url, random_model_dir, monkeypatch, SERVICE_RETENTION_SWEEP_SECONDS="0.2", **archiving
    ):
        for _ in range(600):
            kinds = {kind for kind, _ in await _rows(database_url)}
            if {"token_record", "not_compactable"} <= kinds:
                break
            await asyncio.sleep(0.1)
    archived = _assert_rows_reencode(await _rows(database_url))
    assert {"token_record", "not_compactable"} <= {fact.KIND for fact in archived}


# ---------------------------------------------------------------------------------------------------------
# Round trips of generated facts.

_ids = st.lists(st.integers(min_value=0, max_value=200_000), max_size=12)
_text = st.text(max_size=12)
_scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False) | _text
_json_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=4,
)
_objects = st.dictionaries(_text, _json_values, max_size=4)


@st.composite
def _tokens(draw: st.DrawFn) -> TokensFact:
    ids = draw(_ids)
    logprobs = draw(st.none() | st.lists(_objects | st.none(), min_size=len(ids), max_size=len(ids)))
    groups = None
    grouped: bool = draw(st.booleans())
    if ids and grouped:
        cuts = sorted(draw(st.sets(st.integers(1, len(ids) - 1), max_size=len(ids) - 1))) if len(ids) > 1 else []
        sizes = [b - a for a, b in zip([0, *cuts], [*cuts, len(ids)], strict=True)]
        groups = sizes if any(size > 1 for size in sizes) else None
    return TokensFact(ids=ids, logprobs=logprobs, groups=groups)


_sampling = st.builds(
    Sampling,
    max_new_tokens=st.integers(1, 100_000),
    temperature=st.floats(0, 2),
    top_p=st.floats(0, 1),
    seed=st.integers(0, 2**63 - 1),
    top_logprobs=st.integers(0, 20),
    frequency_penalty=st.floats(-2, 2),
    presence_penalty=st.floats(-2, 2),
)
_maybe_empty: st.SearchStrategy[dict[str, Any] | None] = st.none() | st.just({}) | _objects
_requests = st.builds(
    RequestFact,
    request=_objects,
    response=_objects,
    prompt_items=st.lists(_objects, max_size=3),
    instructions=st.none() | _text,
    tools=st.lists(_objects, max_size=2),
    constraints=st.none() | _objects,
    reasoning_effort=st.sampled_from(["low", "medium", "high"]),
    prompt_token_ids=_ids,
    input_item_count=st.integers(0, 10),
    conversation_id=st.none() | _text,
    input_items=st.none() | st.lists(_objects, max_size=2),
    mcp_listed=st.none() | st.lists(_objects, max_size=2),
    approved_call=st.none()
    | st.builds(ApprovedCall, server_label=_text, name=_text, arguments=_text, approval_request_id=_text),
    sealed_secrets=st.none() | st.dictionaries(_text, _text, max_size=2),
    mcp_secret_labels=st.none() | st.lists(_text, max_size=2),
    compaction_item=st.none() | _objects,
    store=st.booleans(),
    project=st.none() | _text,
    logprobs=st.booleans(),
    sampling=_sampling,
)
_any_fact = st.one_of(
    _requests,
    _tokens(),
    st.builds(
        ToolCallStarted, index=st.integers(0, 50), namespace=_text, name=_text, arguments=_text, idempotency_key=_text
    ),
    st.builds(
        ToolCallResult,
        index=st.integers(0, 50),
        output=st.none() | _text,
        error=st.none() | _text,
        details=_maybe_empty,
    ),
    st.just(CancelRequested()),
    st.builds(TokenRecord, zlib=_text),
    st.just(NotCompactable()),
)


def _normal(fact: facts.Fact) -> facts.Fact:
    """`fact` as decoding gives it back: an empty value of an *omitted when empty* field reads as None."""
    return decode_fact(fact.KIND, fact_data(fact))


@settings(max_examples=100, deadline=None)
@given(_any_fact)
def test_every_fact_round_trips(fact: facts.Fact) -> None:
    encoded = encode_fact(fact)
    decoded = decode_fact(fact.KIND, encoded)
    assert encode_fact(decoded) == encoded
    assert decoded == _normal(fact)
    assert decode_fact(fact.KIND, json.loads(encoded)) == decoded  # a parsed row decodes the same


@settings(max_examples=100, deadline=None)
@given(_requests)
def test_the_request_fact_is_what_the_dict_builder_wrote(fact: RequestFact) -> None:
    """commands.create built the request fact as a dict with conditional spreads before RequestFact; the same
    values give the same bytes (the builder as it was, field for field)."""
    sampling = fact.sampling
    old = {
        "request": fact.request,
        "response": fact.response,
        "prompt_items": fact.prompt_items,
        "instructions": fact.instructions,
        "tools": fact.tools,
        **({"constraints": fact.constraints} if fact.constraints is not None else {}),
        "reasoning_effort": fact.reasoning_effort,
        "prompt_token_ids": fact.prompt_token_ids,
        "input_item_count": fact.input_item_count,
        **({"conversation_id": fact.conversation_id} if fact.conversation_id is not None else {}),
        **({"input_items": fact.input_items} if fact.input_items is not None else {}),
        # what PreparedTools.fact_fields spread in
        **({"mcp_listed": fact.mcp_listed} if fact.mcp_listed else {}),
        **({"approved_call": fact_data(fact.approved_call)} if fact.approved_call else {}),
        **({"sealed_secrets": fact.sealed_secrets} if fact.sealed_secrets else {}),
        **({"mcp_secret_labels": fact.mcp_secret_labels} if fact.mcp_secret_labels else {}),
        **({"compaction_item": fact.compaction_item} if fact.compaction_item is not None else {}),
        "store": fact.store,
        **({"project": fact.project} if fact.project is not None else {}),
        "logprobs": fact.logprobs,
        "sampling": {  # runs.state.sampling_fact
            "max_new_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": sampling.seed,
            "top_logprobs": sampling.top_logprobs,
            "frequency_penalty": sampling.frequency_penalty,
            "presence_penalty": sampling.presence_penalty,
        },
    }
    assert encode_fact(fact) == _json(old)


def _merged_as_before(datas: list[dict[str, Any]]) -> dict[str, Any]:
    """token_facts.merge_token_facts as it was written over dicts."""
    ids = [token for data in datas for token in data["ids"]]
    merged: dict[str, Any] = {"ids": ids}
    if any("logprobs" in data for data in datas):
        merged["logprobs"] = [entry for data in datas for entry in data.get("logprobs", [None] * len(data["ids"]))]
    groups = [size for data in datas for size in (data.get("groups") or [1] * len(data["ids"]))]
    if any(size > 1 for size in groups):
        merged["groups"] = groups
    return merged


@settings(max_examples=100, deadline=None)
@given(st.lists(_tokens(), min_size=1, max_size=4), _tokens())
def test_token_merges_are_what_the_dict_code_wrote(chunks: list[TokensFact], step: TokensFact) -> None:
    datas = [fact_data(fact) for fact in chunks]
    assert encode_fact(TokensFact.merge(chunks)) == _json(_merged_as_before(datas))
    if chunks[-1].ids:  # token_facts.join_last_group: a step's ids join the last group of a non-empty chunk
        old = _merged_as_before([datas[-1], fact_data(step)])
        sizes = datas[-1].get("groups") or [1] * len(datas[-1]["ids"])
        old["groups"] = sizes[:-1] + [sizes[-1] + len(step.ids)]
        assert encode_fact(chunks[-1].join_last_group(step)) == _json(old)


def test_decoding_old_rows_and_malformed_ones() -> None:
    """A row older than a key reads as its readers assumed; a newer replica's key is ignored; a row without a
    required key, or of an unknown kind, is MalformedFact."""
    old = {"max_new_tokens": 5, "temperature": 1.0, "top_p": 1.0, "seed": 3, "top_logprobs": 0}
    assert decode_as(Sampling, old) == Sampling(max_new_tokens=5, temperature=1.0, top_p=1.0, seed=3, top_logprobs=0)
    assert decode_as(Sampling, old).presence_penalty == 0.0 == decode_as(Sampling, old).frequency_penalty
    assert decode_as(ToolCallResult, {"index": 1, "output": "ok", "error": None, "later": 1}) == ToolCallResult(
        index=1, output="ok"
    )
    assert decode_fact("cancel_requested", "{}") == CancelRequested()
    with pytest.raises(MalformedFact, match="without `ids`"):
        decode_fact("tokens", "{}")
    with pytest.raises(MalformedFact, match="no fact kind"):
        decode_fact("tokens_v9", "{}")
    with pytest.raises(MalformedFact, match="JSON object"):
        decode_fact("tokens", "[1]")
    assert set(FACT_TYPES) == {
        "request",
        "tokens",
        "tool_call_started",
        "tool_call_result",
        "cancel_requested",
        "token_record",
        "not_compactable",
    }
