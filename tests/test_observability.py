"""What an operator sees: /health and /ready (flipping to 503 when the database is unreachable),
Prometheus metrics after a run with a known token count, JSON log lines, X-Request-Id."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ServerProcess
from tests.faults import FaultProxy

ServerFactory = Callable[..., ServerProcess]


def _metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    reply = httpx.get(url + "/metrics")
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(reply.text)
        for sample in family.samples
    }


def test_metrics_after_a_run_with_a_known_token_count(database_url: str, app_factory: ServerFactory) -> None:
    server = app_factory(database_url).start()
    # Counters and histograms are the process's (prometheus_client's registry, one app per process in production):
    # an in-process server shares them with the servers this process ran before, so what counts is what this
    # test's requests add.
    before = _metrics(server.url)
    reply = httpx.post(server.url + "/v1/responses", json={"input": "count", "max_output_tokens": 7}, timeout=120)
    assert reply.status_code == 200
    assert reply.json()["usage"]["output_tokens"] == 7
    streamed = {"input": "s", "max_output_tokens": 5, "stream": True}
    with httpx.stream("POST", server.url + "/v1/responses", json=streamed, timeout=120) as stream:
        assert sum(1 for line in stream.iter_lines() if line.startswith("event: ")) > 0
    httpx.get(server.url + "/v1/responses/resp_" + "0" * 48)  # a 404

    after = _metrics(server.url)
    metrics = {name: value - before.get(name, 0.0) for name, value in after.items()}
    assert metrics[("service_tokens_generated_total", ())] == 12
    route = "/v1/responses"
    assert metrics[("service_http_requests_total", (("method", "POST"), ("route", route), ("status", "200")))] == 2
    unknown = (("method", "GET"), ("route", "/v1/responses/{response_id}"), ("status", "404"))
    assert metrics[("service_http_requests_total", unknown)] == 1
    assert metrics[("service_time_to_first_token_seconds_count", ())] == 2
    assert metrics[("service_inter_token_latency_seconds_count", ())] == 12 - 2
    assert metrics[("service_group_commit_seconds_count", ())] >= 1
    assert metrics[("service_engine_step_seconds_count", ())] >= 12
    assert metrics[("service_event_append_seconds_count", (("command", "create"),))] == 2
    assert after[("service_active_runs", ())] == 0 and after[("service_sse_subscribers", ())] == 0  # gauges: now
    assert ("service_lease_takeovers_total", ()) in metrics and ("service_store_retries_total", ()) in metrics


def test_json_logs_with_request_ids_and_no_secrets(tmp_path: Path, app_factory: ServerFactory) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'service.db'}"
    secret, prompt = "sk-env-very-secret", "my private prompt words"
    server = app_factory(url, SERVICE_API_KEY=secret, log_level="info").start()
    headers = {"Authorization": f"Bearer {secret}", "X-Request-Id": "trace-42"}
    reply = httpx.post(server.url + "/v1/responses", json={"input": prompt, "max_output_tokens": 2}, headers=headers)
    assert reply.status_code == 200 and reply.headers["x-request-id"] == "trace-42"
    response_id = reply.json()["id"]
    generated = httpx.get(server.url + "/v1/models")  # a 401 carries an id too
    assert generated.status_code == 401 and generated.headers["x-request-id"].startswith("req_")
    bad = httpx.get(server.url + "/health", headers={"X-Request-Id": "spaces / and slashes"})
    assert bad.headers["x-request-id"].startswith("req_")
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}  # no internals

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "trace-42" not in server.log_path.read_text():
        time.sleep(0.1)
    text = server.log_path.read_text()
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]  # every line is JSON
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    access = [line for line in lines if line.get("request_id") == "trace-42"]
    assert access and access[-1]["response_id"] == response_id and access[-1]["project"] == "default"
    assert access[-1]["route"] == "/v1/responses" and access[-1]["status"] == 200
    assert secret not in text and prompt not in text


def test_ready_is_503_while_the_database_is_unreachable(
    proxied_postgres: tuple[str, FaultProxy], app_factory: ServerFactory
) -> None:
    url, proxy = proxied_postgres
    server = app_factory(url).start()
    ready = httpx.get(server.url + "/ready", timeout=10)
    assert ready.status_code == 200, ready.text
    assert ready.json() == {
        "status": "ok",
        "checks": {"database": True, "model": True, "run_loop": True, "accepting": True},
    }
    proxy.cut(8.0)
    down = httpx.get(server.url + "/ready", timeout=10)
    assert down.status_code == 503 and down.json()["checks"]["database"] is False
    assert httpx.get(server.url + "/health").status_code == 200  # alive all the same
    deadline = time.monotonic() + 30
    while httpx.get(server.url + "/ready", timeout=10).status_code != 200:
        assert time.monotonic() < deadline, "not ready again after the outage"
        time.sleep(0.5)
