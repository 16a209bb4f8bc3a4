"""Every SQL query the docs' "SQL inspection" section documents (docs/operations.md; it was the README's) runs on
the database it is written for, against responses created through the real server, and answers what its title says."""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy.engine import make_url

from service.engine.scripted import Rule, write_scripted_model
from tests.api_helpers import client_for, final_text
from tests.conftest import ROOT, ServerProcess

PLACEHOLDER = "'resp_…'"


def readme_queries() -> dict[str, dict[str, str]]:
    """{dialect: {query number: SQL}} from the operations page's ```sql blocks; a block's first line: its dialect."""
    blocks = re.findall(r"```sql\n(.*?)```", (ROOT / "docs" / "operations.md").read_text(), flags=re.DOTALL)
    queries: dict[str, dict[str, str]] = {}
    for block in blocks:
        first, _, body = block.partition("\n")
        dialect = {"-- SQLite": "sqlite", "-- PostgreSQL": "postgresql"}[first.strip()]
        for statement in body.split(";"):
            number = re.search(r"^-- (\d+)\. ", statement, flags=re.MULTILINE)
            sql = "\n".join(line for line in statement.splitlines() if not line.startswith("--")).strip()
            if sql:
                assert number, f"every README query has a numbered title: {statement!r}"
                queries.setdefault(dialect, {})[number.group(1)] = sql
    return queries


def test_the_readme_gives_every_query_in_both_dialects() -> None:
    queries = readme_queries()
    assert set(queries) == {"sqlite", "postgresql"}
    assert set(queries["sqlite"]) == set(queries["postgresql"]) and len(queries["sqlite"]) >= 3


def run_query(database_url: str, sql: str) -> list[tuple[Any, ...]]:
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        with sqlite3.connect(str(url.database)) as connection:
            return connection.execute(sql).fetchall()

    async def fetch() -> list[tuple[Any, ...]]:
        connection = await asyncpg.connect(url.set(drivername="postgresql").render_as_string(hide_password=False))
        try:
            return [tuple(row) for row in await connection.fetch(sql)]
        finally:
            await connection.close()

    return asyncio.run(fetch())


# A scripted model (service/engine/scripted.py) that answers each turn by itself, so that the conversation the
# queries read has an answer in every turn whatever a model's weights draw (first match wins: the second turn
# reasons, then answers with its analysis in the sequence).
RULES = [
    Rule("<|channel|>final<|message|>Then we talk.<|return|>", ["They ask what follows."]),
    Rule("<|channel|>analysis<|message|>They ask what follows.<|end|><|start|>", ["And then?"]),
    Rule("<|channel|>final<|message|>Hello! How can I help?<|return|>"),
]


def test_every_readme_query_runs_on_its_database(
    database_url: str, app_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    model = write_scripted_model(tmp_path / "scripted", RULES)
    server = app_factory(database_url, SERVICE_MODEL=str(model)).start()
    client = client_for(server.url)
    first = client.responses.create(input="Hello there", max_output_tokens=32, extra_body={"seed": 1})
    second = client.responses.create(
        input="And then?", previous_response_id=first.id, max_output_tokens=32, extra_body={"seed": 2}
    )
    events = [
        e.model_dump(mode="json") for e in client.responses.create(input="Streamed", max_output_tokens=6, stream=True)
    ]
    streamed = events[-1]["response"]
    ids = {first.id, second.id, streamed["id"]}
    text = final_text(second.model_dump(mode="json"))
    assert text == "Then we talk."

    dialect = make_url(database_url).get_backend_name()
    results = {
        number: run_query(database_url, sql.replace(PLACEHOLDER, f"'{second.id}'"))
        for number, sql in readme_queries()[dialect].items()
    }
    latest = results["1"]
    assert {row[0] for row in latest} == ids and all(row[1] in ("completed", "incomplete") for row in latest)
    assert all(str(row[3]).startswith("20") for row in latest)  # a readable date and time
    conversation = results["2"]
    assert [row[0] for row in conversation] == sorted(row[0] for row in conversation)
    messages = [(row[1], row[3]) for row in conversation if row[2] == "message"]
    assert messages[0] == ("user", "Hello there") and ("user", "And then?") in messages
    assert ("assistant", text) == messages[-1]
    assert results["3"] == [(text,)]
    assert sum(row[2] for row in results["4"]) == 3
    tokens = [r.usage.output_tokens for r in (first, second) if r.usage] + [streamed["usage"]["output_tokens"]]
    assert sum(row[3] for row in results["4"]) == sum(tokens)
