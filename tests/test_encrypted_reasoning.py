"""Encrypted reasoning for stateless clients (issue 38): `include: ["reasoning.encrypted_content"]` seals each
reasoning item (service/sealing.py, at the HTTP edge: service/http/include_view.py); sent back as an input item
it is opened into the prompt as the model's own earlier reasoning. Through the real server and the openai client:
a store=false round trip renders the prompt the stored previous_response_id chain renders; a tampered blob,
another project's, and one sealed under a rotated SERVICE_SECRET_KEY are 400 invalid_encrypted_content naming
the input index; the blob holds no plaintext; every event and Response carrying it validates strictly."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from typing import Any, Final

import httpx
import openai
import pytest
from cryptography.fernet import Fernet

from tests.cli_helpers import run_cli
from tests.conftest import InProcessServer, ServerProcess
from tests.test_conformance import assert_event_conforms, assert_response_conforms, sse_data
from tests.test_websocket import MODEL, TERMINAL, _send, _until_terminal

ServerFactory = Callable[..., ServerProcess]
ENCRYPTED: Final = "reasoning.encrypted_content"


def _key(database_url: str, name: str, project: str) -> str:
    result = run_cli("keys", "create", name, "--project", project, SERVICE_DATABASE_URL=database_url)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def two_projects(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str, str]]:
    """A server (no SERVICE_SECRET_KEY: the database's stored key) and the keys of two projects."""
    tmp = tmp_path_factory.mktemp("encrypted_reasoning")
    url = f"sqlite+aiosqlite:///{tmp / 'service.db'}"
    assert run_cli("migrate", SERVICE_DATABASE_URL=url).returncode == 0
    key_a, key_b = _key(url, "a", "project-a"), _key(url, "b", "project-b")
    server = InProcessServer(url, tmp / "server.log").start()
    yield server, key_a, key_b
    server.stop()


def _client(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)


def _reasoning_turn(client: openai.OpenAI, **extra: Any) -> tuple[int, Any]:
    """Random weights: the first seed whose (seeded, so repeatable) output is one reasoning item with text."""
    for seed in range(40):
        response = client.responses.create(
            input="think", max_output_tokens=8, temperature=2, extra_body={"seed": seed}, **extra
        )
        output = response.output
        if [item.type for item in output] == ["reasoning"] and output[0].content and output[0].content[0].text:
            return seed, response
    raise AssertionError("no seed made the model reason")


def _sent_back(item: Any) -> dict[str, Any]:
    """An output reasoning item as Codex sends it back: id, empty summary, the blob, no content."""
    return {"type": "reasoning", "id": item.id, "summary": [], "encrypted_content": item.encrypted_content}


def _count(url: str, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + "/v1/responses/input_tokens", json=body, headers={"Authorization": f"Bearer {key}"})


def _refused(url: str, key: str, input_items: list[Any]) -> dict[str, Any]:
    reply = httpx.post(
        url + "/v1/responses",
        json={"input": input_items, "max_output_tokens": 2, "store": False},
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )
    assert reply.status_code == 400, reply.text
    error: dict[str, Any] = reply.json()["error"]
    assert error["code"] == "invalid_encrypted_content" and error["type"] == "invalid_request_error"
    return error


def _blob_bytes(blob: str) -> bytes:
    return base64.urlsafe_b64decode(blob + "=" * (-len(blob) % 4))


def _tampered(blob: str, index: int) -> str:
    raw = bytearray(_blob_bytes(blob))
    raw[index] ^= 0x01
    return base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")


def test_store_false_round_trip_renders_the_stored_chains_prompt(two_projects: tuple[ServerProcess, str, str]) -> None:
    server, key_a, _ = two_projects
    client = _client(server.url, key_a)
    seed, first = _reasoning_turn(client, store=False, include=[ENCRYPTED])
    reasoning = first.output[0]
    text = reasoning.content[0].text
    blob = reasoning.encrypted_content
    assert isinstance(blob, str) and blob
    # The blob holds no plaintext: neither the text nor any base64 of it.
    decoded = _blob_bytes(blob)
    for encoded in (text.encode(), base64.b64encode(text.encode()), base64.urlsafe_b64encode(text.encode())):
        assert encoded not in decoded and encoded.decode() not in blob
    assert text.encode() not in decoded
    with pytest.raises(openai.NotFoundError):  # store=false kept nothing to retrieve
        client.responses.retrieve(first.id)

    # The same turn stored (the same seed, so the same reasoning), continued by previous_response_id.
    stored: Any = client.responses.create(input="think", max_output_tokens=8, temperature=2, extra_body={"seed": seed})
    assert stored.output[0].content[0].text == text
    chained = client.responses.create(previous_response_id=stored.id, input="more", max_output_tokens=2)

    # The stateless client sends the whole history back, the reasoning sealed and without its content.
    history = [{"role": "user", "content": "think"}, _sent_back(reasoning)]
    stateless = client.responses.create(
        input=[*history, {"role": "user", "content": "more"}],  # type: ignore[list-item]
        max_output_tokens=2,
        store=False,
        include=[ENCRYPTED],
    )
    assert stateless.usage is not None and chained.usage is not None
    assert stateless.usage.input_tokens == chained.usage.input_tokens

    # The reasoning is in that prompt (not dropped): counted as if sent in clear, and not as if left out.
    more = {"role": "user", "content": "more"}
    sealed = _count(server.url, key_a, {"input": [*history, more]})
    clear = {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": text}]}
    in_clear = _count(server.url, key_a, {"input": [history[0], clear, more]})
    left_out = _count(server.url, key_a, {"input": [history[0], more]})
    chain = _count(server.url, key_a, {"previous_response_id": stored.id, "input": "more"})
    assert sealed.status_code == 200, sealed.text
    assert sealed.json()["input_tokens"] == in_clear.json()["input_tokens"] == chain.json()["input_tokens"]
    assert sealed.json()["input_tokens"] > left_out.json()["input_tokens"]
    # Harmony's rule holds for opened reasoning too: once a final answer follows, it is not shown again.
    answer = {"role": "assistant", "content": "done"}
    after_final = _count(server.url, key_a, {"input": [*history, answer, more]})
    assert after_final.json() == _count(server.url, key_a, {"input": [history[0], answer, more]}).json()
    # The sealed text wins over a `content` sent beside it.
    beside = {**_sent_back(reasoning), "content": [{"type": "reasoning_text", "text": "x" * 50}]}
    assert _count(server.url, key_a, {"input": [history[0], beside, more]}).json() == sealed.json()


def test_tampered_forged_and_other_projects_blobs_are_400s(two_projects: tuple[ServerProcess, str, str]) -> None:
    server, key_a, key_b = two_projects
    _, first = _reasoning_turn(_client(server.url, key_a), store=False, include=[ENCRYPTED])
    item = _sent_back(first.output[0])
    blob = item["encrypted_content"]
    user = {"role": "user", "content": "think"}
    for bad in (_tampered(blob, len(_blob_bytes(blob)) - 1), _tampered(blob, 20), _tampered(blob, 0), "forged", 7):
        error = _refused(server.url, key_a, [user, user, {**item, "encrypted_content": bad}])
        assert error["param"] == "input[2].encrypted_content", error
    # Another project's key: the blob is bound to project-a.
    error = _refused(server.url, key_b, [user, item])
    assert error["param"] == "input[1].encrypted_content" and "another project" in error["message"]
    # Through the official client too, on input_tokens as on create.
    assert _count(server.url, key_b, {"input": [item]}).json()["error"]["code"] == "invalid_encrypted_content"
    with pytest.raises(openai.BadRequestError) as refused:
        _client(server.url, key_b).responses.create(input=[item], max_output_tokens=2)  # type: ignore[list-item]
    assert (refused.value.code, refused.value.param) == ("invalid_encrypted_content", "input[0].encrypted_content")
    # The owner's untouched blob still opens.
    assert _count(server.url, key_a, {"input": [user, item]}).status_code == 200


def test_events_and_reads_carry_encrypted_content_that_conforms(two_projects: tuple[ServerProcess, str, str]) -> None:
    server, key_a, _ = two_projects
    headers = {"Authorization": f"Bearer {key_a}"}
    seed, _ = _reasoning_turn(_client(server.url, key_a), store=False, include=[ENCRYPTED])
    body = {"input": "think", "max_output_tokens": 8, "temperature": 2, "seed": seed, "stream": True}
    with httpx.Client(base_url=server.url, headers=headers, timeout=120) as http:

        def stream(method: str, url: str, **options: Any) -> list[dict[str, Any]]:
            with http.stream(method, url, **options) as reply:
                assert reply.status_code == 200
                return [assert_event_conforms(raw) for raw in sse_data(reply)]

        live = stream("POST", "/v1/responses", json={**body, "include": [ENCRYPTED]})
        done = [e["item"] for e in live if e["type"] == "response.output_item.done"]
        assert [item["type"] for item in done] == ["reasoning"] and isinstance(done[0]["encrypted_content"], str)
        final = live[-1]["response"]["output"]
        assert isinstance(final[0]["encrypted_content"], str)
        added = [e["item"] for e in live if e["type"] == "response.output_item.added"]
        assert "encrypted_content" not in added[0]
        response_id = live[0]["response"]["id"]

        # Reads: with the include, sealed; without it, as stored (no encrypted_content) and byte-stable.
        url = f"/v1/responses/{response_id}"
        retrieved = assert_response_conforms(http.get(url, params={"include": ENCRYPTED}).text)
        assert isinstance(retrieved["output"][0]["encrypted_content"], str)
        assert "encrypted_content" not in http.get(url).json()["output"][0]
        replayed = stream("GET", url, params={"stream": "true", "include[]": ENCRYPTED})
        assert isinstance(replayed[-1]["response"]["output"][0]["encrypted_content"], str)
        plain = stream("GET", url, params={"stream": "true"})
        assert plain == stream("GET", url, params={"stream": "true"})
        assert not any("encrypted_content" in json.dumps(event) for event in plain)

        # Every blob opens: sent back, each counts as the reasoning in clear.
        text = final[0]["content"][0]["text"]
        clear = _count(
            server.url, key_a, {"input": [{"type": "reasoning", "summary": [], "content": final[0]["content"]}]}
        )
        for sealed in (done[0], final[0], retrieved["output"][0], replayed[-1]["response"]["output"][0]):
            item = {"type": "reasoning", "summary": [], "encrypted_content": sealed["encrypted_content"]}
            assert _count(server.url, key_a, {"input": [item]}).json() == clear.json(), text

        # Background (stored) then a read with the include: sealed.
        background = http.post("/v1/responses", json={**body, "stream": False, "background": True})
        assert background.status_code == 200, background.text
        for _ in range(600):
            read = http.get(f"/v1/responses/{background.json()['id']}", params={"include": ENCRYPTED}).json()
            if read["status"] not in ("queued", "in_progress"):
                break
        assert read["output"] and isinstance(read["output"][0]["encrypted_content"], str)
        # A plain (non-stream) create with the include validates strictly too.
        plain_create = http.post(
            "/v1/responses", json={**body, "stream": False, "store": False, "include": [ENCRYPTED]}
        )
        assert isinstance(assert_response_conforms(plain_create.text)["output"][0]["encrypted_content"], str)


def test_a_rotated_secret_key_refuses_old_blobs(database_url: str, app_factory: ServerFactory) -> None:
    url = database_url  # the stored key on both backends
    stored_key = app_factory(url).start()
    _, first = _reasoning_turn(_client(stored_key.url), store=False, include=[ENCRYPTED])
    item = _sent_back(first.output[0])
    stored_key.stop()
    # Restarted without SERVICE_SECRET_KEY: the database's stored key, so the blob still opens.
    restarted = app_factory(url).start()
    assert _count(restarted.url, "unused", {"input": [item]}).status_code == 200
    restarted.stop()

    secret_1, secret_2 = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    first_key = app_factory(url, SERVICE_SECRET_KEY=secret_1).start()
    error = _refused(first_key.url, "unused", [item])
    assert error["param"] == "input[0].encrypted_content" and "rotated" in error["message"]
    _, sealed_1 = _reasoning_turn(_client(first_key.url), store=False, include=[ENCRYPTED])
    item_1 = _sent_back(sealed_1.output[0])
    assert _count(first_key.url, "unused", {"input": [item_1]}).status_code == 200
    first_key.stop()

    rotated = app_factory(url, SERVICE_SECRET_KEY=secret_2).start()
    error = _refused(rotated.url, "unused", [{"role": "user", "content": "hi"}, item_1])
    assert error["param"] == "input[1].encrypted_content" and "rotated" in error["message"]


def test_websocket_mode_seals_and_opens_too(two_projects: tuple[ServerProcess, str, str]) -> None:
    server, key_a, _ = two_projects
    client = _client(server.url, key_a)
    seed, _ = _reasoning_turn(client, store=False, include=[ENCRYPTED])
    body = {"model": MODEL, "input": "think", "max_output_tokens": 8, "temperature": 2, "seed": seed}
    with client.responses.connect() as connection:
        _send(connection, {"type": "response.create", **body, "store": False, "include": [ENCRYPTED]})
        events = [assert_event_conforms(frame) for frame in _until_terminal(connection)]
        item = events[-1]["response"]["output"][0]
        assert item["type"] == "reasoning" and isinstance(item["encrypted_content"], str)
        sent_back = {"type": "reasoning", "summary": [], "encrypted_content": item["encrypted_content"]}
        _send(connection, {"type": "response.create", **body, "store": False, "input": [sent_back]})
        assert json.loads(_until_terminal(connection)[-1])["type"] in TERMINAL
        forged = {**sent_back, "encrypted_content": _tampered(item["encrypted_content"], 30)}
        _send(connection, {"type": "response.create", **body, "store": False, "input": [forged]})
        error = json.loads(_until_terminal(connection)[-1])
    assert error["type"] == "error" and error["error"]["code"] == "invalid_encrypted_content", error
    assert error["error"]["param"] == "input[0].encrypted_content"
