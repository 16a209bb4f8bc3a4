"""Webhooks from the log, through the real server: signed deliveries the official SDK verifies, retries with
backoff under one webhook-id, kill -9 at both crash points, two replicas on one PostgreSQL database, a hanging
receiver beside generation, and the URL policy at `add`."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import httpx2
import openai
import pytest
from openai import OpenAI

from service.config import Settings
from service.store import webhook_outbox as outbox
from service.tools.mcp_policy import McpUrlRefused
from service.webhooks import delivery, signing
from tests.api_helpers import client_for, sql_rows, wait_until_terminal
from tests.cli_helpers import assert_one_line_error, run_cli
from tests.conftest import free_port
from tests.test_mcp_policy import listener  # noqa: F401 (fixture)
from tests.webhook_receiver import Receiver

# A short schedule: look every 0.1 s, first retry after ~0.3 s, each POST at most 2 s.
FAST = {
    "SERVICE_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
    "SERVICE_WEBHOOK_POLL_SECONDS": "0.1",
    "SERVICE_WEBHOOK_BACKOFF_BASE_SECONDS": "0.3",
    "SERVICE_WEBHOOK_TIMEOUT_SECONDS": "2",
}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


def add_endpoint(database_url: str, url: str, *args: str, **env: str) -> tuple[str, str]:
    """(endpoint id, signing secret) of a new endpoint added with the CLI."""
    settings: dict[str, str] = {**FAST, **env, "SERVICE_DATABASE_URL": database_url}
    result = run_cli("webhooks", "add", url, *args, **settings)  # type: ignore[arg-type]
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    endpoint_id = lines[0].split()[3]
    return endpoint_id, lines[-1]


def cli(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, SERVICE_DATABASE_URL=database_url, SERVICE_WEBHOOK_ALLOWED_HOSTS="127.0.0.1")


def background(client: OpenAI, text: str = "hello", tokens: int = 8) -> str:
    return client.responses.create(input=text, max_output_tokens=tokens, background=True).id


def test_sign_matches_the_sdk() -> None:
    secret = signing.new_secret()
    body = b'{"id":"evt_1","object":"event","created_at":1,"type":"response.completed","data":{"id":"resp_1"}}'
    headers = signing.headers(secret, "msg_1", body)
    event = OpenAI(api_key="x").webhooks.unwrap(body, headers, secret=secret)
    assert event.type == "response.completed" and event.data.id == "resp_1"
    with pytest.raises(openai.InvalidWebhookSignatureError):
        OpenAI(api_key="x").webhooks.unwrap(body.replace(b"resp_1", b"resp_2"), headers, secret=secret)


def test_deliveries_verify_with_the_sdk(database_url: str, app_factory: Any, receiver: Receiver) -> None:
    server = app_factory(database_url, **FAST).start()
    endpoint_id, secret = add_endpoint(database_url, receiver.url)
    assert secret.startswith("whsec_")
    client = client_for(server.url)
    ids = [background(client, f"note {i}") for i in range(2)]
    foreground = client.responses.create(input="not background", max_output_tokens=4).id  # not announced
    for rid in ids:
        wait_until_terminal(client, rid)
    got = receiver.wait_for(lambda rs: len(rs) >= 2)
    sdk = OpenAI(api_key="x")
    announced = set()
    for request in got:
        event = sdk.webhooks.unwrap(request.body, request.headers, secret=secret)
        assert event.type == "response.incomplete"  # max_output_tokens reached
        assert event.object == "event" and event.id.startswith("evt_")
        announced.add(event.data.id)
        with pytest.raises(openai.InvalidWebhookSignatureError):
            sdk.webhooks.unwrap(request.body.replace(b"evt_", b"evx_"), request.headers, secret=secret)
    assert announced == set(ids) and foreground not in announced
    rows = sql_rows(database_url, "SELECT status, attempts FROM webhook_deliveries ORDER BY created_at")
    assert rows == [("delivered", 1), ("delivered", 1)]
    listed = run_cli("webhooks", "list", SERVICE_DATABASE_URL=database_url)
    assert endpoint_id in listed.stdout and secret not in listed.stdout


def test_retries_with_backoff_under_one_id(database_url: str, app_factory: Any, receiver: Receiver) -> None:
    receiver.behave = lambda _id, nth: (500 if nth <= 3 else 200, 0.0)
    server = app_factory(database_url, **FAST).start()
    add_endpoint(database_url, receiver.url)
    client = client_for(server.url)
    rid = background(client)
    wait_until_terminal(client, rid)
    got = receiver.wait_for(lambda rs: any(r.status == 200 for r in rs))
    time.sleep(1.0)  # nothing more arrives after the success
    got = list(receiver.received)
    assert [r.status for r in got] == [500, 500, 500, 200]
    assert len({r.webhook_id for r in got}) == 1
    assert len({json.loads(r.body)["id"] for r in got}) == 1
    gaps = [b.started - a.started for a, b in zip(got, got[1:], strict=False)]
    assert gaps[2] > gaps[0] and gaps[0] >= 0.15, gaps  # 0.3·2^n with jitter in [50%, 100%]
    attempts = sql_rows(
        database_url, "SELECT attempt, status_code, error, latency_seconds FROM webhook_attempts ORDER BY attempt"
    )
    assert [(a, s) for a, s, _e, _l in attempts] == [(1, 500), (2, 500), (3, 500), (4, 200)]
    assert attempts[0][2] == "HTTP 500" and attempts[3][2] is None and all(lat >= 0 for *_x, lat in attempts)
    assert sql_rows(database_url, "SELECT status, attempts FROM webhook_deliveries") == [("delivered", 4)]


def test_private_url_refused_at_add(database_url: str, app_factory: Any) -> None:
    app_factory(database_url).start()  # migrates
    for url in ("http://127.0.0.1:9/hook", "http://10.1.2.3/hook", "http://169.254.169.254/latest", "ftp://x/y"):
        result = run_cli("webhooks", "add", url, SERVICE_DATABASE_URL=database_url)
        assert_one_line_error(result)
    assert sql_rows(database_url, "SELECT count(*) FROM webhook_endpoints") == [(0,)]
    allowed = run_cli(
        "webhooks", "add", "http://127.0.0.1:9/hook", SERVICE_DATABASE_URL=database_url,
        SERVICE_WEBHOOK_ALLOWED_HOSTS="127.0.0.1",
    )  # fmt: skip
    assert allowed.returncode == 0, allowed.stderr
    bad_event = run_cli(
        "webhooks", "add", "http://127.0.0.1:9/hook", "--events", "response.done", SERVICE_DATABASE_URL=database_url,
        SERVICE_WEBHOOK_ALLOWED_HOSTS="127.0.0.1",
    )  # fmt: skip
    assert_one_line_error(bad_event, "response.done")


def test_kill_between_commit_and_delivery(database_url: str, server_factory: Any) -> None:
    """The receiver is down when the response ends and the server is killed; after the restart the outbox row,
    committed with the terminal event, is delivered with its id."""
    port = free_port()
    server = server_factory(database_url, **FAST).start()
    _endpoint, secret = add_endpoint(database_url, f"http://127.0.0.1:{port}/hook")
    client = client_for(server.url)
    rid = background(client)
    wait_until_terminal(client, rid)
    server.kill()
    [(webhook_id, status)] = sql_rows(database_url, "SELECT id, status FROM webhook_deliveries")
    assert status == "pending"
    receiver = Receiver().start(port)
    try:
        server_factory(database_url, **FAST).start()
        got = receiver.wait_for(lambda rs: any(r.status == 200 for r in rs))
        assert {r.webhook_id for r in got} == {webhook_id}
        OpenAI(api_key="x").webhooks.unwrap(got[0].body, got[0].headers, secret=secret)
        assert json.loads(got[0].body)["data"]["id"] == rid
        wait_for_rows(database_url, "SELECT status FROM webhook_deliveries", [("delivered",)])
    finally:
        receiver.stop()


def test_kill_between_post_and_recording(database_url: str, server_factory: Any, receiver: Receiver) -> None:
    """The server dies while its POST is in flight: the row stays pending, and once its lease expires the
    restarted server sends it again with the same webhook-id (at least once)."""
    receiver.behave = lambda _id, nth: (200, 1.5 if nth == 1 else 0.0)
    server = server_factory(database_url, **FAST).start()
    add_endpoint(database_url, receiver.url)
    client = client_for(server.url)
    rid = background(client)
    wait_until_terminal(client, rid)
    receiver.wait_for(lambda rs: len(rs) >= 1)
    server.kill()  # the receiver is still sleeping on the first POST
    assert sql_rows(database_url, "SELECT status, attempts FROM webhook_deliveries") == [("pending", 1)]
    server_factory(database_url, **FAST).start()
    got = receiver.wait_for(lambda rs: len(rs) >= 2 and rs[1].status == 200)
    assert len({r.webhook_id for r in got}) == 1
    wait_for_rows(database_url, "SELECT status, attempts FROM webhook_deliveries", [("delivered", 2)])
    # The killed attempt was never recorded; the one after the restart was.
    assert sql_rows(database_url, "SELECT attempt, status_code FROM webhook_attempts") == [(2, 200)]


def test_deleting_a_response_drops_its_undelivered_rows(database_url: str, app_factory: Any) -> None:
    server = app_factory(database_url, **FAST).start()
    add_endpoint(database_url, f"http://127.0.0.1:{free_port()}/hook")  # nobody listens: stays pending
    client = client_for(server.url)
    rid = background(client)
    wait_until_terminal(client, rid)
    assert sql_rows(database_url, "SELECT status FROM webhook_deliveries WHERE response_id = :r", r=rid) == [
        ("pending",)
    ]
    client.responses.delete(rid)
    assert sql_rows(database_url, "SELECT count(*) FROM webhook_deliveries WHERE response_id = :r", r=rid) == [(0,)]


def test_two_replicas_never_deliver_one_row_at_once(database_url: str, server_factory: Any, receiver: Receiver) -> None:
    if database_url.startswith("sqlite"):
        pytest.skip("replicas share a PostgreSQL database")
    # Slow, failing twice: every row is claimed several times, by either replica.
    receiver.behave = lambda _id, nth: (503 if nth <= 2 else 200, 0.3)
    a = server_factory(database_url, **FAST).start()
    b = server_factory(database_url, **FAST).start()
    add_endpoint(database_url, receiver.url)
    ids = [background(client_for(server.url), f"r{i}") for i, server in enumerate([a, b] * 3)]
    for rid in ids:
        wait_until_terminal(client_for(a.url), rid)
    got = receiver.wait_for(lambda rs: sum(r.status == 200 for r in rs) >= len(ids), timeout=90)
    by_id: dict[str, list[tuple[float, float]]] = {}
    for r in got:
        by_id.setdefault(r.webhook_id, []).append((r.started, r.ended))
    assert len(by_id) == len(ids)
    for spans in by_id.values():
        spans.sort()
        assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:], strict=False)), spans
    workers = sql_rows(database_url, "SELECT DISTINCT worker FROM webhook_attempts")
    assert len(workers) == 2  # both replicas delivered
    wait_for_rows(database_url, "SELECT DISTINCT status FROM webhook_deliveries", [("delivered",)])


def test_hanging_receiver_does_not_slow_generation(database_url: str, app_factory: Any, receiver: Receiver) -> None:
    server = app_factory(database_url, **FAST, SERVICE_WEBHOOK_CONCURRENCY_PER_ENDPOINT="2").start()
    client = client_for(server.url)

    def streamed_seconds() -> float:
        started = time.monotonic()
        with client.responses.create(input="measure me", max_output_tokens=64, stream=True) as stream:
            for _event in stream:
                pass
        return time.monotonic() - started

    streamed_seconds()  # warm
    baseline = min(streamed_seconds() for _ in range(2))
    receiver.behave = lambda _id, _nth: (200, 30.0)  # hangs past the 2 s timeout, every time
    add_endpoint(database_url, receiver.url)
    for rid in [background(client, f"h{i}") for i in range(6)]:
        wait_until_terminal(client, rid)
    receiver.wait_for(lambda rs: len(rs) >= 2)
    loaded = max(streamed_seconds() for _ in range(2))
    hanging = [r for r in receiver.received if r.ended == 0.0]
    assert hanging, "the receiver should still hold requests while the stream ran"
    assert loaded < 3 * baseline + 1.0, (baseline, loaded)
    # Bounded concurrency per endpoint: at most 2 POSTs in flight from this server at any moment, by the server's
    # own record of each attempt (the receiver holds a request long after the server gave up on it at 2 s).
    deadline = time.monotonic() + 60
    while len(attempts := sql_rows(database_url, "SELECT started_at, latency_seconds FROM webhook_attempts")) < 4:
        assert time.monotonic() < deadline, attempts
        time.sleep(0.2)
    spans = [(start, start + latency) for start, latency in attempts]
    assert max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans) <= 2, spans
    print(f"stream of 64 tokens: {baseline:.3f}s alone, {loaded:.3f}s beside a hanging receiver")


def wait_for_rows(database_url: str, statement: str, expected: list[tuple[Any, ...]], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while (rows := sql_rows(database_url, statement)) != expected and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rows == expected


def test_gives_up_after_the_window_and_cli_views(database_url: str, app_factory: Any, receiver: Receiver) -> None:
    """A receiver that always fails: the row is `failed` once the retry window has passed, visibly (CLI, metric).
    An `--all-responses` endpoint hears foreground responses too; `test` sends a signed sample; `remove` goes."""
    receiver.behave = lambda _id, _nth: (500, 0.0)
    env = {**FAST, "SERVICE_WEBHOOK_RETRY_WINDOW_SECONDS": "1.5"}
    server = app_factory(database_url, **env).start()
    failures = _failed_deliveries(server.url)  # the process's counter: in-process servers before this one count too
    endpoint_id, secret = add_endpoint(database_url, receiver.url, "--all-responses", "--events", "response.incomplete")
    client = client_for(server.url)
    rid = client.responses.create(input="foreground", max_output_tokens=4).id  # heard: --all-responses
    wait_for_rows(database_url, "SELECT response_id, status FROM webhook_deliveries", [(rid, "failed")])
    [(attempts, error)] = sql_rows(database_url, "SELECT attempts, last_error FROM webhook_deliveries")
    assert attempts >= 2 and error == "HTTP 500"
    assert sql_rows(database_url, "SELECT count(*) FROM webhook_attempts") == [(attempts,)]
    assert _failed_deliveries(server.url) == failures + 1
    failed = cli(database_url, "webhooks", "deliveries", "--status", "failed")
    assert rid in failed.stdout and "HTTP 500" in failed.stdout
    listed = cli(database_url, "webhooks", "list")
    assert endpoint_id in listed.stdout and " 1 " in listed.stdout.splitlines()[1]
    receiver.behave = lambda _id, _nth: (204, 0.0)
    before = len(receiver.received)
    tested = cli(database_url, "webhooks", "test", endpoint_id)
    assert tested.returncode == 0 and "HTTP 204" in tested.stdout, tested.stdout + tested.stderr
    sample = receiver.received[before]
    assert OpenAI(api_key="x").webhooks.unwrap(sample.body, sample.headers, secret=secret).type == "response.completed"
    removed = cli(database_url, "webhooks", "remove", endpoint_id)
    assert removed.returncode == 0, removed.stderr
    assert sql_rows(database_url, "SELECT count(*) FROM webhook_endpoints") == [(0,)]
    assert_one_line_error(cli(database_url, "webhooks", "remove", endpoint_id), endpoint_id)


def _failed_deliveries(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(FAILED_SAMPLE))


FAILED_SAMPLE = 'service_webhook_deliveries_total{outcome="failed"} '


def test_retention_drops_undelivered_rows_with_their_response(database_url: str, app_factory: Any) -> None:
    server = app_factory(
        database_url, **FAST, SERVICE_RETENTION_DAYS="0.00003", SERVICE_RETENTION_SWEEP_SECONDS="0.5"
    ).start()  # responses expire ~2.6 s after creation
    add_endpoint(database_url, f"http://127.0.0.1:{free_port()}/hook")  # nobody listens: stays pending
    client = client_for(server.url)
    rid = background(client)
    wait_for_rows(database_url, "SELECT response_id, status FROM webhook_deliveries", [(rid, "pending")], timeout=60)
    wait_for_rows(database_url, "SELECT count(*) FROM webhook_deliveries", [(0,)])
    assert sql_rows(database_url, "SELECT count(*) FROM responses WHERE id = :r", r=rid) == [(0,)]


def test_webhook_type_and_backoff() -> None:
    def terminal(kind: str, status: str) -> list[dict[str, Any]]:
        return [{"type": "response.output_text.delta"}, {"type": kind, "response": {"status": status}}]

    assert outbox.webhook_type(terminal("response.completed", "completed")) == "response.completed"
    assert outbox.webhook_type(terminal("response.incomplete", "cancelled")) == "response.cancelled"
    assert outbox.webhook_type(terminal("response.incomplete", "incomplete")) == "response.incomplete"
    assert outbox.webhook_type(terminal("response.failed", "failed")) == "response.failed"
    assert outbox.webhook_type([{"type": "response.output_text.delta"}]) is None
    rng = random.Random(1)
    delays = [delivery.backoff(n, 2.0, rng) for n in range(1, 6)]
    assert all(2.0 * 2 ** (n - 1) * 0.5 <= d <= 2.0 * 2 ** (n - 1) for n, d in zip(range(1, 6), delays, strict=True))
    assert delivery.lease_seconds(10) > 10  # a POST ends before its row may be claimed again


def test_an_endpoint_hears_only_its_project(database_url: str, app_factory: Any, receiver: Receiver) -> None:
    server = app_factory(database_url, **FAST, SERVICE_API_KEY="sesame").start()  # `default`'s key
    created = run_cli("keys", "create", "r", "--project", "research", SERVICE_DATABASE_URL=database_url)
    research_key = created.stdout.strip().splitlines()[-1]
    add_endpoint(database_url, receiver.url, "--project", "research")
    research = OpenAI(base_url=server.url + "/v1", api_key=research_key, max_retries=0)
    default = OpenAI(base_url=server.url + "/v1", api_key="sesame", max_retries=0)
    theirs, ours = background(default, "default's"), background(research, "research's")
    wait_until_terminal(default, theirs)
    wait_until_terminal(research, ours)
    got = receiver.wait_for(lambda rs: len(rs) >= 1)
    time.sleep(0.5)
    assert [json.loads(r.body)["data"]["id"] for r in got] == [ours]
    assert sql_rows(database_url, "SELECT response_id, project FROM webhook_deliveries") == [(ours, "research")]


async def test_a_name_rebound_to_loopback_is_refused_at_connect(
    listener: tuple[int, list[int]],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Deliveries connect through the MCP client's guarded backend: a name that passed the URL check as a public
    address and resolves to loopback when connecting is refused there, and so is loopback by name; nothing is
    contacted until the allow list names the host."""
    port, accepted = listener
    real = socket.getaddrinfo

    def rebound(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "rebind.test":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebound)
    async with delivery.guarded_http_client(delivery.address_policy(Settings()), timeout=5) as client:
        with pytest.raises(McpUrlRefused):
            await client.post(f"http://rebind.test:{port}/hook", content=b"{}")
    assert accepted == []
    async with delivery.guarded_http_client(delivery.address_policy(Settings()), timeout=5) as client:
        with pytest.raises(McpUrlRefused):
            await client.post(f"http://localhost:{port}/hook", content=b"{}")
    assert accepted == []
    allowed = Settings(webhook_allowed_hosts="localhost")
    async with delivery.guarded_http_client(delivery.address_policy(allowed), timeout=5) as client:
        with pytest.raises(httpx2.HTTPError):  # the listener closes at once: reached, no HTTP answer
            await client.post(f"http://localhost:{port}/hook", content=b"{}")
    deadline = time.monotonic() + 5
    while not accepted and time.monotonic() < deadline:  # the listener's thread counts it
        await asyncio.sleep(0.05)
    assert accepted == [1]
