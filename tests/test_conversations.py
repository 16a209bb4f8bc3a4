"""Conversations end to end: the official client's `client.conversations.*`, the `conversation`
parameter of POST /v1/responses, `responses.input_tokens.count`, on SQLite and PostgreSQL, across a
restart; `doctor` and `rebuild-projections` over conversation streams."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import openai
import pytest
import sqlalchemy as sa
from openai import OpenAI

from service.store.db import create_engine
from tests.api_helpers import client_for, wait_until_terminal
from tests.conftest import ROOT, ServerProcess
from tests.faults import doctor

ServerFactory = Callable[..., ServerProcess]

TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]


def _query(database_url: str, sql: str) -> list[tuple[Any, ...]]:
    async def run() -> list[tuple[Any, ...]]:
        db = create_engine(database_url)
        try:
            async with db.connect() as connection:
                return [tuple(row) for row in await connection.execute(sa.text(sql))]
        finally:
            await db.dispose()

    return asyncio.run(run())


def _ids(client: OpenAI, conversation_id: str, **params: Any) -> list[str]:
    return [item.id for item in client.conversations.items.list(conversation_id, **params).data if item.id]


def _all_ids(client: OpenAI, conversation_id: str) -> list[str]:
    """Every item id, oldest first, walking the pages with `after` (the client's auto-pagination)."""
    return [str(item.id) for item in client.conversations.items.list(conversation_id, order="asc", limit=2)]


def test_conversation_operations_and_responses_on_a_conversation(database_url: str, app_factory: ServerFactory) -> None:
    server = app_factory(database_url).start()
    client = client_for(server.url)

    conversation = client.conversations.create(
        items=[
            {"type": "message", "role": "user", "content": "My name is Ada."},
            {"type": "message", "role": "assistant", "content": "Hello Ada."},
        ],
        metadata={"topic": "names"},
    )
    assert conversation.id.startswith("conv_") and conversation.object == "conversation"
    assert conversation.metadata == {"topic": "names"}
    assert client.conversations.retrieve(conversation.id) == conversation
    updated = client.conversations.update(conversation.id, metadata={"topic": "greetings"})
    assert updated.metadata == {"topic": "greetings"} and updated.created_at == conversation.created_at

    first_two = _ids(client, conversation.id, order="asc")
    assert len(first_two) == 2 and _ids(client, conversation.id) == first_two[::-1]  # default order: desc
    added = client.conversations.items.create(
        conversation.id,
        items=[
            {"type": "message", "role": "user", "content": "What is 2+2?"},
            {"type": "message", "role": "assistant", "content": "4"},
        ],
        include=["message.output_text.logprobs"],
    )
    assert [item.type for item in added.data] == ["message", "message"]
    assert added.first_id == added.data[0].id and not added.has_more
    every = first_two + [item.id for item in added.data if item.id]
    assert _all_ids(client, conversation.id) == every
    page = client.conversations.items.list(conversation.id, order="asc", limit=1, after=every[1])
    assert [item.id for item in page.data] == [every[2]] and page.has_more
    item = client.conversations.items.retrieve(every[2], conversation_id=conversation.id)
    assert item.type == "message" and item.content[0].text == "What is 2+2?"  # type: ignore[union-attr]
    after_delete = client.conversations.items.delete(every[3], conversation_id=conversation.id)
    assert after_delete.id == conversation.id
    every = every[:3]
    assert _all_ids(client, conversation.id) == every

    # 404s and 400s in OpenAI's shape.
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve("conv_missing")
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.retrieve("msg_missing", conversation_id=conversation.id)
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.list("conv_missing")
    with pytest.raises(openai.BadRequestError) as too_many:
        client.conversations.create(items=[{"type": "message", "role": "user", "content": "x"}] * 21)
    assert too_many.value.body["param"] == "items"  # type: ignore[index]

    # A response on the conversation sees its items and joins them when it ends.
    response = client.responses.create(conversation=conversation.id, input="And my name?", max_output_tokens=6)
    assert response.conversation is not None and response.conversation.id == conversation.id
    inputs = [i.id for i in client.responses.input_items.list(response.id, order="asc").data]
    outputs = [o.id for o in response.output]
    assert _all_ids(client, conversation.id) == every + inputs + outputs
    # The conversation's items are the history: the same input counts more tokens on it than alone.
    alone = client.responses.input_tokens.count(input="And my name?")
    on_it = client.responses.input_tokens.count(input="And my name?", conversation=conversation.id)
    assert on_it.input_tokens > alone.input_tokens

    # {"id": …} works too; a background run joins the conversation when it ends.
    background = client.responses.create(
        conversation={"id": conversation.id}, input="Thanks", max_output_tokens=4, background=True
    )
    finished = wait_until_terminal(client, background.id)
    background_inputs = [i.id for i in client.responses.input_items.list(background.id, order="asc").data]
    expected = every + inputs + outputs + background_inputs + [o.id for o in finished.output]
    assert _all_ids(client, conversation.id) == expected

    with pytest.raises(openai.BadRequestError) as both:
        client.responses.create(conversation=conversation.id, previous_response_id=response.id, input="x")
    assert both.value.body["param"] == "conversation"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.responses.create(conversation="conv_missing", input="x")

    # Across a restart: the same conversation, the same items.
    server.stop()
    tables = {
        "conversations": "SELECT * FROM conversations ORDER BY id",
        "conversation_entries": "SELECT * FROM conversation_entries ORDER BY conversation_id, ordinal",
        "conversation_messages": "SELECT * FROM conversation_messages ORDER BY conversation_id, turn, ordinal",
    }
    before = {name: _query(database_url, sql) for name, sql in tables.items()}
    rows = [row for row in before["conversation_messages"] if row[0] == conversation.id]
    assert [row[8] for row in rows] == expected  # item_id, in order, readable in SQL
    report = doctor(database_url)
    assert report.returncode == 0, report.stdout + report.stderr
    assert "1 conversations" in report.stdout
    subprocess.run(
        [sys.executable, "-m", "service", "rebuild-projections"],
        cwd=ROOT,
        check=True,
        env={"SERVICE_DATABASE_URL": database_url, "PATH": "/usr/bin:/bin"},
    )
    assert {name: _query(database_url, sql) for name, sql in tables.items()} == before

    server = app_factory(database_url).start()
    client = client_for(server.url)
    assert client.conversations.retrieve(conversation.id).metadata == {"topic": "greetings"}
    assert _all_ids(client, conversation.id) == expected

    deleted = client.conversations.delete(conversation.id)
    assert deleted.deleted and deleted.id == conversation.id
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conversation.id)
    with pytest.raises(openai.NotFoundError):
        client.conversations.delete(conversation.id)
    assert _query(database_url, f"SELECT COUNT(*) FROM events WHERE response_id = '{conversation.id}'") == [(0,)]
    assert _query(database_url, "SELECT COUNT(*) FROM conversation_entries") == [(0,)]
    server.stop()
    report = doctor(database_url)
    assert report.returncode == 0, report.stdout + report.stderr


def test_input_tokens_equal_usage(database_url: str, app_factory: ServerFactory) -> None:
    server = app_factory(database_url).start()
    client = client_for(server.url)
    first = client.responses.create(input="Hello there", max_output_tokens=3)
    conversation = client.conversations.create(items=[{"type": "message", "role": "user", "content": "Hi, I am Bo."}])
    cases: list[dict[str, Any]] = [
        {"input": "Count me"},
        {"input": "Weather in Paris?", "tools": TOOLS, "instructions": "Answer briefly."},
        {"input": [{"role": "developer", "content": "Be terse."}, {"role": "user", "content": "Hi"}]},
        {"input": "And again", "previous_response_id": first.id},
        {"input": "Who am I?", "conversation": conversation.id},
    ]
    for case in cases:
        counted = client.responses.input_tokens.count(**case)
        assert counted.object == "response.input_tokens"
        created = client.responses.create(**case, max_output_tokens=2)
        assert created.usage is not None and counted.input_tokens == created.usage.input_tokens, case


def test_input_tokens_without_input_counts_the_history(database_url: str, app_factory: ServerFactory) -> None:
    server = app_factory(database_url).start()
    client = client_for(server.url)
    said: list[Any] = [{"type": "message", "role": "user", "content": "Hi, I am Bo."}]
    conversation = client.conversations.create(items=said)
    history_only = client.responses.input_tokens.count(conversation=conversation.id)
    # The conversation's items render exactly as the same items sent as input.
    assert history_only.input_tokens == client.responses.input_tokens.count(input=said).input_tokens
    assert (
        history_only.input_tokens
        < client.responses.input_tokens.count(conversation=conversation.id, input="Who am I?").input_tokens
    )
    first = client.responses.create(input="Hello there", max_output_tokens=3)
    chained = client.responses.input_tokens.count(previous_response_id=first.id)
    assert first.usage is not None and chained.input_tokens >= first.usage.input_tokens
    assert client.responses.input_tokens.count(previous_response_id=first.id, input="More").input_tokens > (
        chained.input_tokens
    )
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.input_tokens.count(instructions="Nothing to count")
    assert refused.value.code == "missing_required_parameter" and refused.value.param == "input"


def test_concurrent_runs_on_one_conversation_append_whole_blocks_in_commit_order(
    database_url: str, app_factory: ServerFactory
) -> None:
    """The rule: a response's items join its conversation in the transaction that ends it, as one
    block, in commit order; runs started together each see the conversation as it was when they began."""
    server = app_factory(database_url).start()
    client = client_for(server.url)
    conversation = client.conversations.create(items=[{"type": "message", "role": "user", "content": "Start"}])
    start = _all_ids(client, conversation.id)
    ids: list[str] = []
    errors: list[BaseException] = []

    def run(text: str, tokens: int) -> None:
        try:
            response = client.responses.create(conversation=conversation.id, input=text, max_output_tokens=tokens)
            ids.append(response.id)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(f"run {n}", 6 + 4 * n)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(ids) == 3
    items = _all_ids(client, conversation.id)
    assert items[: len(start)] == start
    blocks: dict[str, list[str]] = {}
    for rid in ids:
        inputs = [i.id for i in client.responses.input_items.list(rid, order="asc").data]
        blocks[rid] = inputs + [str(o.id) for o in client.responses.retrieve(rid).output]
    rest = items[len(start) :]
    assert sorted(rest) == sorted(i for block in blocks.values() for i in block)
    # Each block is contiguous; their order is the order in which the runs ended.
    order = sorted(blocks, key=lambda rid: rest.index(blocks[rid][0]))
    assert rest == [i for rid in order for i in blocks[rid]]
    completed = [client.responses.retrieve(rid).completed_at or 0 for rid in order]
    assert completed == sorted(completed)
    server.stop()
    report = doctor(database_url)
    assert report.returncode == 0, report.stdout + report.stderr


def test_migration_0003_upgrades_a_database_holding_0001_data(database_url: str, app_factory: ServerFactory) -> None:
    """Data written at revision 0001 (a chain of responses) survives the upgrades: the new
    `conversation_messages` view shows the chain as before (now with its owner), and conversations
    work on top, in the default project."""
    from alembic import command

    from service.store.db import alembic_config, migrate_sync

    server = app_factory(database_url).start()
    client = client_for(server.url)
    first = client.responses.create(input="one", max_output_tokens=3)
    client.responses.create(input="two", previous_response_id=first.id, max_output_tokens=3)
    server.stop()
    columns = "conversation_id, turn, response_id, ordinal, source, type, role, text, item_id"
    chain_sql = f"SELECT {columns} FROM conversation_messages ORDER BY conversation_id, turn, ordinal"
    before = _query(database_url, chain_sql)
    assert before

    command.downgrade(alembic_config(database_url), "0001")
    assert _query(database_url, chain_sql) == before  # the 0001 view, over the same rows
    migrate_sync(database_url)
    assert _query(database_url, chain_sql) == before
    assert _query(database_url, "SELECT COUNT(*) FROM conversations") == [(0,)]
    assert set(_query(database_url, "SELECT DISTINCT project FROM conversation_messages")) == {("default",)}
    report = doctor(database_url)
    assert report.returncode == 0, report.stdout + report.stderr

    server = app_factory(database_url).start()
    client = client_for(server.url)
    conversation = client.conversations.create(items=[{"type": "message", "role": "user", "content": "after"}])
    assert len(_all_ids(client, conversation.id)) == 1
    query = f"SELECT project FROM conversations WHERE id = '{conversation.id}'"
    assert _query(database_url, query) == [("default",)]


def test_truncation_at_the_window_edge_leaves_room_for_the_output(
    database_url: str, app_factory: ServerFactory
) -> None:
    """A prompt that fits but leaves less than max_output_tokens: `auto` drops the oldest whole items
    until the output fits (input_tokens predicts it); `disabled` runs with what room remains; a
    prompt over the window is a 400 that gives the numbers."""
    server = app_factory(database_url).start()
    client = client_for(server.url)
    context = client.models.list().data[0].model_extra["info"]["decoder"]["max_position"]  # type: ignore[index]
    turn = "lorem ipsum dolor sit amet " * 20
    history: list[Any] = [{"role": "user", "content": f"{i}: {turn}"} for i in range(60)]
    # Grow the history until the next item would bring the prompt within 200 tokens of the window.
    size = 1
    while size < len(history):
        try:
            if client.responses.input_tokens.count(input=history[: size + 1]).input_tokens >= context - 200:
                break
        except openai.BadRequestError:
            break
        size += 1
    edge = history[:size]
    prompt = client.responses.input_tokens.count(input=edge).input_tokens
    wanted = context - prompt + 50  # more than the room left
    auto = client.responses.create(input=edge, max_output_tokens=wanted, truncation="auto")
    assert auto.usage is not None and auto.usage.input_tokens + wanted <= context
    assert auto.usage.input_tokens < prompt
    counted = client.responses.input_tokens.count(
        input=edge, truncation="auto", extra_body={"max_output_tokens": wanted}
    )
    assert counted.input_tokens == auto.usage.input_tokens
    disabled = client.responses.create(input=edge, max_output_tokens=2)
    assert disabled.usage is not None and disabled.usage.input_tokens == prompt
    with pytest.raises(openai.BadRequestError) as over:
        client.responses.create(input=history, max_output_tokens=wanted)
    error = over.value.body
    assert error["code"] == "context_length_exceeded"  # type: ignore[index]
    assert str(context) in error["message"] and str(wanted) in error["message"]  # type: ignore[index]
