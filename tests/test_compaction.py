"""Context compaction end to end with the official client: `client.responses.compact`, the sealed
`compaction` item sent back as input, tampering, and `context_management` (service/compaction.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseCompactionItem, ResponseStreamEvent
from pydantic import TypeAdapter

from service import compaction
from service.errors import InvalidRequest
from service.tools.secrets import new_key
from tests.api_helpers import COMPACT_AT_ONCE, client_for, sql_rows
from tests.conftest import ServerProcess
from tests.faults import assert_doctor_clean_and_projections_rebuild, doctor

ServerFactory = Callable[..., ServerProcess]
OPENAI_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def _history(client: openai.OpenAI) -> tuple[str, list[Any]]:
    """A three-turn chain; returns the last response id and the model id. Seeded: what the random model
    writes decides how much compaction saves, so an unseeded chain would make the token counts a draw."""
    previous: str | None = None
    for seed, text in enumerate(("My name is Bo.", "I live in Oslo.", "I like tea.")):
        response = client.responses.create(
            input=text, previous_response_id=previous, max_output_tokens=24, extra_body={"seed": seed}
        )
        assert response.status in ("completed", "incomplete")
        previous = response.id
    assert previous is not None
    return previous, [item.model_dump(exclude_none=True) for item in client.responses.input_items.list(previous)]


def test_compact_round_trip_and_tampering(database_url: str, app_factory: ServerFactory) -> None:
    key = new_key()
    server = app_factory(database_url, SERVICE_SECRET_KEY=key).start()
    client = client_for(server.url)
    model = client.models.list().data[0].id
    last, _ = _history(client)

    compacted = client.responses.compact(model=model, previous_response_id=last)
    assert compacted.object == "response.compaction"
    kinds = [(item.type, getattr(item, "role", None)) for item in compacted.output]
    # Like OpenAI: every user message, then one compaction item.
    assert kinds == [("message", "user")] * 3 + [("compaction", None)]
    sealed = compacted.output[-1]
    assert sealed.type == "compaction" and sealed.encrypted_content
    full = client.responses.input_tokens.count(previous_response_id=last, input="Where do I live?").input_tokens
    assert compacted.usage.input_tokens == client.responses.input_tokens.count(previous_response_id=last).input_tokens

    # Sent back as input, the compacted list renders as the kept context: fewer prompt tokens.
    again: list[Any] = [item.model_dump(exclude_none=True, warnings=False) for item in compacted.output]
    again.append({"type": "message", "role": "user", "content": "Where do I live?"})
    counted = client.responses.input_tokens.count(input=again).input_tokens
    response = client.responses.create(input=again, max_output_tokens=8)
    assert response.status in ("completed", "incomplete") and response.usage is not None
    assert response.usage.input_tokens == counted < full

    # Compacting a list that holds a compaction item works too (the item expands first).
    assert client.responses.compact(model=model, input=again).output[-1].type == "compaction"

    # The same server key after a restart still opens it.
    server.stop()
    server.start()
    assert client.responses.input_tokens.count(input=again).input_tokens == counted

    content = sealed.encrypted_content
    body, tag = content.split(".")
    forged = [
        content[:-2] + ("AA" if content[-2:] != "AA" else "BB"),  # altered tag
        ("B" if body[0] != "B" else "C") + body[1:] + "." + tag,  # altered body
        "not-a-compaction",
        "",
    ]
    for bad in forged:
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(input=[{"type": "compaction", "encrypted_content": bad}, *again[4:]])
        assert refused.value.code == "invalid_encrypted_content"
        assert refused.value.param == "input[0].encrypted_content"
    with pytest.raises(openai.BadRequestError) as unknown:
        client.post("/responses/compact", cast_to=object, body={"model": model, "input": "x", "tools": []})
    assert unknown.value.code == "unknown_parameter"


def test_compaction_item_from_another_key_is_refused(database_url: str, app_factory: ServerFactory) -> None:
    server = app_factory(database_url, SERVICE_SECRET_KEY=new_key()).start()
    client = client_for(server.url)
    other = compaction.seal(compaction.compaction_key(new_key(), b""), project="default", compaction_id="cmp_x")
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(input=[{"type": "compaction", "encrypted_content": other}], max_output_tokens=2)
    assert refused.value.code == "invalid_encrypted_content"


def test_context_management_compacts_past_the_threshold(database_url: str, app_factory: ServerFactory) -> None:
    server = app_factory(database_url).start()
    client = client_for(server.url)
    last, _ = _history(client)
    full = client.responses.input_tokens.count(previous_response_id=last, input="And my name?").input_tokens
    managed: Any = {"previous_response_id": last, "input": "And my name?", "max_output_tokens": 4}

    below = client.responses.create(**managed, context_management=[{"type": "compaction", "compact_threshold": full}])
    assert below.usage is not None and below.usage.input_tokens == full and below.previous_response_id == last

    rule: Any = [{"type": "compaction", "compact_threshold": full - 1}]
    counted = client.responses.input_tokens.count(
        previous_response_id=last, input="And my name?", extra_body={"context_management": rule}
    ).input_tokens
    above = client.responses.create(**managed, context_management=rule)
    assert above.usage is not None and above.usage.input_tokens == counted < full
    items = list(client.responses.input_items.list(above.id, order="asc"))
    texts = [item.content[0].text for item in items if item.type == "message"]  # type: ignore[union-attr]
    assert texts[:3] == ["My name is Bo.", "I live in Oslo.", "I like tea."]
    assert texts[3].startswith("[Earlier context compacted: ") and texts[-1] == "And my name?"

    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(input="x", context_management=[{"type": "other", "compact_threshold": 1}])
    assert refused.value.param is not None and "context_management" in refused.value.param


def test_sealed_content_is_bound_to_key_and_project() -> None:
    key = compaction.compaction_key("k", b"")
    sealed = compaction.seal(key, project="p", compaction_id="cmp_1")
    assert compaction.open_sealed(key, project="p", content=sealed, param="x") == "cmp_1"
    assert "cmp_1" not in sealed  # opaque: base64 of a versioned reference
    stored = compaction.compaction_key(None, b"\x01" * 32)
    for project, used in (("q", key), ("p", compaction.compaction_key("other", b"")), ("p", stored)):
        with pytest.raises(InvalidRequest):
            compaction.open_sealed(used, project=project, content=sealed, param="x")


def test_state_is_server_side_with_a_stored_key(database_url: str, app_factory: ServerFactory) -> None:
    """Without SERVICE_SECRET_KEY: the key is the database's (survives a restart, shared by replicas);
    the item refers to a `compactions` row of its project; once that row is gone the item is refused."""
    server = app_factory(database_url).start()
    client = client_for(server.url)
    model = client.models.list().data[0].id
    last, _ = _history(client)
    compacted = client.responses.compact(model=model, previous_response_id=last)
    item = compacted.output[-1]
    assert item.type == "compaction"
    rows = sql_rows(database_url, "SELECT id, project, data FROM compactions")
    assert [(row[0], row[1]) for row in rows] == [(item.id, "default")]
    state = json.loads(rows[0][2])
    # Dropped: the model's output items of the 3 turns (messages, reasoning: the random model varies).
    assert len(state["dropped"]) >= 3 and all(m.get("role") != "user" for m in state["dropped"])
    assert len(state["summary"]) == 1
    assert "Earlier context" not in (item.encrypted_content or "")  # only a reference travels
    again: Any = [
        {"type": "compaction", "encrypted_content": item.encrypted_content},
        {"type": "message", "role": "user", "content": "Where do I live?"},
    ]
    counted = client.responses.input_tokens.count(input=again).input_tokens

    server.stop()
    replica = app_factory(database_url).start()  # a fresh app (the key is read from the database): the same key
    other = client_for(replica.url)
    assert other.responses.input_tokens.count(input=again).input_tokens == counted

    sql_rows(database_url, "DELETE FROM compactions")
    with pytest.raises(openai.BadRequestError) as refused:
        other.responses.create(input=again, max_output_tokens=2)
    assert refused.value.code == "invalid_encrypted_content" and "no longer exists" in refused.value.message
    replica.stop()
    report = doctor(database_url)
    assert report.returncode == 0, report.stdout + report.stderr


def test_managed_response_carries_its_compaction_item(database_url: str, app_factory: ServerFactory) -> None:
    """Like OpenAI's: a response compacted by `context_management` has the `compaction` item first in its
    `output`, streamed as added/compacting/done (strictly the SDK's types), logged, and replayed the same."""
    server = app_factory(database_url).start()
    client = client_for(server.url)
    last, _ = _history(client)
    full = client.responses.input_tokens.count(previous_response_id=last, input="And my name?").input_tokens
    body = {
        "previous_response_id": last,
        "input": "And my name?",
        "max_output_tokens": 4,
        "context_management": [{"type": "compaction", "compact_threshold": full - 1}],
        "stream": True,
    }
    with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=120) as stream:
        live = stream.read()
    frames = [line[len("data: ") :] for line in live.decode().splitlines() if line.startswith("data: ")]
    events = [OPENAI_EVENT.validate_json(frame, strict=True) for frame in frames]
    response_id = events[0].response.id
    head = [(e.type, getattr(e, "output_index", None)) for e in events[2:5]]
    assert head == [
        ("response.output_item.added", 0),
        ("response.compaction.compacting", 0),
        ("response.output_item.done", 0),
    ]
    item = events[4].item
    assert isinstance(item, ResponseCompactionItem) and item.id.startswith("cmp_")

    # Stored and retrieved (strictly the SDK's Response), in the log, replayed byte for byte.
    response = Response.model_validate_json(client.responses.retrieve(response_id).model_dump_json(), strict=True)
    assert response.output[0] == item and len(response.output) > 1
    logged = sql_rows(database_url, "SELECT type FROM events WHERE response_id = :rid", rid=response_id)
    assert ("response.compaction.compacting",) in logged
    params = {"stream": "true"}
    with httpx.stream("GET", f"{server.url}/v1/responses/{response_id}", params=params, timeout=120) as replay:
        assert replay.read() == live
    assert [(row[0], row[1]) for row in sql_rows(database_url, "SELECT id, project FROM compactions")] == [
        (item.id, "default")
    ]

    # The chain goes on from it (the item renders as nothing: its summary is in the response's input),
    # and its encrypted_content opens as an input item.
    follow = client.responses.create(previous_response_id=response_id, input="Thanks.", max_output_tokens=2)
    counted = client.responses.input_tokens.count(previous_response_id=response_id, input="Thanks.").input_tokens
    assert follow.usage is not None and follow.usage.input_tokens == counted
    sent_back: Any = [item.model_dump(exclude_none=True), {"type": "message", "role": "user", "content": "Hi"}]
    assert client.responses.input_tokens.count(input=sent_back).input_tokens > 0
    server.stop()

    # After the replay window its stream is compacted to a token record and still replays byte for byte.
    server = app_factory(database_url, **COMPACT_AT_ONCE).start()
    recorded = "SELECT kind FROM run_facts WHERE response_id = :rid AND kind IN ('token_record', 'not_compactable')"
    deadline = time.monotonic() + 60
    while not sql_rows(database_url, recorded, rid=response_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sql_rows(database_url, recorded, rid=response_id) == [("token_record",)]
    with httpx.stream("GET", f"{server.url}/v1/responses/{response_id}", params=params, timeout=120) as replay:
        assert replay.read() == live
    server.stop()
    assert_doctor_clean_and_projections_rebuild(database_url)
    assert sql_rows(database_url, "SELECT id FROM compactions") == [(item.id,)]  # not a projection: kept
