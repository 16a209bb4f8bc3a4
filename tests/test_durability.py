"""Runs outlive the process that started them: restart, kill -9, cancel while the owner is dead,
two replicas on one database, and projections rebuilt from the log."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import openai
import pytest

from tests.api_helpers import (
    assert_well_formed_stream,
    client_for,
    final_text,
    raw_events,
    sql_rows,
    text_from_deltas,
    wait_until_terminal,
)
from tests.conftest import ROOT, ServerProcess

ServerFactory = Callable[..., ServerProcess]


def _read_until(stream: Any, count: int) -> list[dict[str, Any]]:
    seen = []
    for event in stream:
        seen.append(event.model_dump())
        if len(seen) >= count:
            break
    return seen


def test_restart_between_create_and_retrieve(database_url: str, server_factory: ServerFactory) -> None:
    server = server_factory(database_url).start()
    client = client_for(server.url)
    plain = client.responses.create(input="keep me", max_output_tokens=10)
    chained = client.responses.create(input="and me", previous_response_id=plain.id, max_output_tokens=10)
    background = client.responses.create(
        input="run across a restart", max_output_tokens=200, background=True, extra_body={"seed": 4}
    )
    server.stop()  # SIGTERM: leases are handed back
    server = server_factory(database_url).start()
    client = client_for(server.url)
    assert client.responses.retrieve(plain.id).model_dump() == plain.model_dump()
    assert client.responses.retrieve(chained.id).previous_response_id == plain.id
    finished = wait_until_terminal(client, background.id)
    assert finished.status in ("completed", "incomplete")
    events = raw_events(server.url, background.id)
    assert_well_formed_stream(events)
    assert final_text(finished.model_dump()) == text_from_deltas(events)


def test_kill_9_mid_stream_resumes_with_the_same_tokens(database_url: str, server_factory: ServerFactory) -> None:
    server = server_factory(database_url).start()
    client = client_for(server.url)
    prompt, seed = "a story that survives a crash", {"seed": 1234}
    logprobs: Any = {"top_logprobs": 2, "include": ["message.output_text.logprobs"]}
    reference = client.responses.create(input=prompt, max_output_tokens=300, extra_body=seed, **logprobs)

    stream = client.responses.create(
        input=prompt, max_output_tokens=300, extra_body=seed, background=True, stream=True, **logprobs
    )
    seen = _read_until(stream, 12)  # a few steps in: a delta may carry several tokens
    response_id = seen[0]["response"]["id"]
    server.kill()  # kill -9 while generating
    server = server_factory(database_url).start()
    client = client_for(server.url)
    rest = [
        e.model_dump()
        for e in client.responses.retrieve(response_id, stream=True, starting_after=seen[-1]["sequence_number"])
    ]
    whole = seen + rest
    assert_well_formed_stream(whole)
    final = client.responses.retrieve(response_id).model_dump()
    assert final_text(final) == text_from_deltas(whole)
    assert [i["type"] for i in final["output"]] == [i.type for i in reference.output]
    assert final_text(final) == reference.output_text, "a resumed run draws exactly the uninterrupted run's tokens"
    assert final["usage"]["output_tokens"] == reference.usage.output_tokens

    def logprobs_of(output: list[dict[str, Any]]) -> list[Any]:
        return [part["logprobs"] for item in output if item["type"] == "message" for part in item["content"]]

    assert logprobs_of(final["output"]) == logprobs_of(reference.model_dump()["output"])
    claims = sql_rows(database_url, "SELECT claims FROM runs WHERE response_id = :id", id=response_id)
    assert claims[0][0] >= 2, "the run was claimed again after the crash"


def test_cancel_while_the_owner_is_dead_wins(database_url: str, server_factory: ServerFactory) -> None:
    owner = server_factory(database_url, SERVICE_LEASE_SECONDS="4").start()
    survivor = server_factory(database_url, SERVICE_LEASE_SECONDS="4").start()
    client = client_for(owner.url)
    response = client.responses.create(input="long", max_output_tokens=3000, background=True)
    deadline = time.monotonic() + 60
    while not client.responses.retrieve(response.id).output and time.monotonic() < deadline:
        time.sleep(0.05)
    # make sure the server we kill is the one generating
    owner_pid = sql_rows(database_url, "SELECT owner FROM runs WHERE response_id = :id", id=response.id)[0][0]
    victim, other = (owner, survivor) if f"-{owner.process.pid}-" in owner_pid else (survivor, owner)  # type: ignore[union-attr]
    victim.kill()
    cancelled = client_for(other.url).responses.cancel(response.id)  # waits until the lease expires and it is claimed
    assert cancelled.status == "cancelled"
    events = raw_events(other.url, response.id)
    assert_well_formed_stream(events)
    assert events[-1]["response"]["status"] == "cancelled"


def test_two_replicas_survivor_finishes_the_run(database_url: str, server_factory: ServerFactory) -> None:
    a = server_factory(database_url).start()
    b = server_factory(database_url).start()
    # Long enough that the victim is still generating when it is killed, however slow the machine is.
    response = client_for(a.url).responses.create(
        input="replicated", max_output_tokens=1500, background=True, extra_body={"seed": 9}
    )
    deadline = time.monotonic() + 60
    owner = None
    while owner is None and time.monotonic() < deadline:
        owner = sql_rows(database_url, "SELECT owner FROM runs WHERE response_id = :id", id=response.id)[0][0]
        time.sleep(0.05)
    assert owner is not None
    victim, survivor = (a, b) if f"-{a.process.pid}-" in owner else (b, a)  # type: ignore[union-attr]
    client = client_for(survivor.url)
    stream = client.responses.retrieve(response.id, stream=True)
    seen = _read_until(stream, 10)
    victim.kill()
    seen += [e.model_dump() for e in stream]  # the same connection keeps tailing what the survivor generates
    assert_well_formed_stream(seen)
    final = client.responses.retrieve(response.id).model_dump()
    assert final_text(final) == text_from_deltas(seen)
    new_owner = sql_rows(database_url, "SELECT claims FROM runs WHERE response_id = :id", id=response.id)[0][0]
    assert new_owner >= 2


def test_rebuild_projections_gives_identical_tables(database_url: str, server_factory: ServerFactory) -> None:
    server = server_factory(database_url).start()
    client = client_for(server.url)
    first = client.responses.create(
        input=[{"role": "user", "content": "one"}, {"role": "user", "content": "two"}],
        max_output_tokens=20,
        instructions="Be terse.",
    )
    client.responses.create(input="three", previous_response_id=first.id, max_output_tokens=20)
    long = client.responses.create(input="cancel me", max_output_tokens=3000, background=True)
    while not client.responses.retrieve(long.id).output:
        time.sleep(0.05)
    client.responses.cancel(long.id)
    server.stop()

    tables = {
        "responses": "SELECT * FROM responses ORDER BY id",
        "conversation_items": "SELECT * FROM conversation_items ORDER BY response_id, ordinal",
        "conversation_messages": "SELECT * FROM conversation_messages ORDER BY conversation_id, turn, ordinal",
    }
    before = {name: sql_rows(database_url, sql) for name, sql in tables.items()}
    assert len(before["responses"]) == 3
    subprocess.run(
        [sys.executable, "-m", "service", "rebuild-projections"],
        cwd=ROOT,
        check=True,
        env={"SERVICE_DATABASE_URL": database_url, "PATH": "/usr/bin:/bin"},
    )
    after = {name: sql_rows(database_url, sql) for name, sql in tables.items()}
    assert after == before


def test_sigterm_hands_runs_over_and_ends_streams_cleanly(database_url: str, server_factory: ServerFactory) -> None:
    a = server_factory(database_url).start()
    b = server_factory(database_url).start()
    client_a = client_for(a.url)
    response = client_a.responses.create(input="hand over", max_output_tokens=400, background=True)
    stream = client_a.responses.retrieve(response.id, stream=True)
    seen = _read_until(stream, 5)
    started = time.monotonic()
    a.stop()  # SIGTERM; the stream from A ends without a terminal event
    seen += [e.model_dump() for e in stream]
    assert time.monotonic() - started < 15
    client_b = client_for(b.url)
    seen += [
        e.model_dump()
        for e in client_b.responses.retrieve(response.id, stream=True, starting_after=seen[-1]["sequence_number"])
    ]
    assert_well_formed_stream(seen)


@pytest.mark.parametrize("missing", ["resp_nope"])
def test_cancel_unknown_is_404(database_url: str, server_factory: ServerFactory, missing: str) -> None:
    server = server_factory(database_url).start()
    with pytest.raises(openai.NotFoundError):
        client_for(server.url).responses.cancel(missing)


def test_the_queue_and_its_order_survive_a_restart(database_url: str, server_factory: ServerFactory) -> None:
    server = server_factory(database_url, SERVICE_MAX_ACTIVE_RUNS="1").start()
    client = client_for(server.url)
    ids = [client.responses.create(input=f"queued {n}", max_output_tokens=60, background=True).id for n in range(3)]
    assert client.responses.retrieve(ids[-1]).status == "queued"
    server.stop()  # one run in flight, three waiting
    server = server_factory(database_url, SERVICE_MAX_ACTIVE_RUNS="1").start()
    client = client_for(server.url)
    finals = [wait_until_terminal(client, response_id) for response_id in ids]
    assert all(final.status in ("completed", "incomplete") for final in finals)
    finished_at = [final.completed_at for final in finals]
    assert finished_at == sorted(finished_at), "runs finished in the order they were queued"
