"""Each limit through the real server: its status, OpenAI-style error and headers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.limits import RequestRateLimiter, SubscriberLimit, check_runs
from tests.cli_helpers import run_cli
from tests.conftest import ServerProcess

ServerFactory = Callable[..., ServerProcess]
LONG = 3000  # output tokens: a run that is still going while the test looks at it


def _key(database_url: str, name: str) -> str:
    result = run_cli("keys", "create", name, "--project", name, SERVICE_DATABASE_URL=database_url)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def _post(url: str, key: str, body: dict[str, Any] | None = None, **options: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(url + "/v1/responses", json=body, headers=headers, timeout=60, **options)


def _error(reply: httpx.Response, status: int, error_type: str, code: str) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    error: dict[str, Any] = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == (error_type, code), error
    return error


def test_requests_per_minute_per_key(tmp_path: Path, app_factory: ServerFactory) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'service.db'}"
    assert run_cli("migrate", SERVICE_DATABASE_URL=url).returncode == 0
    alice, bob = _key(url, "alice"), _key(url, "bob")
    server = app_factory(url, SERVICE_RATE_LIMIT_REQUESTS_PER_MINUTE="3").start()
    headers = {"Authorization": f"Bearer {alice}"}
    remaining = [httpx.get(server.url + "/v1/models", headers=headers) for _ in range(3)]
    assert [r.status_code for r in remaining] == [200, 200, 200]
    assert [r.headers["x-ratelimit-remaining-requests"] for r in remaining] == ["2", "1", "0"]
    assert all(r.headers["x-ratelimit-limit-requests"] == "3" for r in remaining)
    limited = httpx.get(server.url + "/v1/models", headers=headers)
    _error(limited, 429, "rate_limit_error", "rate_limit_exceeded")
    assert int(limited.headers["retry-after"]) >= 1
    assert limited.headers["x-ratelimit-remaining-requests"] == "0"
    # Per key: bob has his own budget.
    assert httpx.get(server.url + "/v1/models", headers={"Authorization": f"Bearer {bob}"}).status_code == 200


def test_runs_per_project_queue_depth_subscribers_and_sizes(tmp_path: Path, app_factory: ServerFactory) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'service.db'}"
    assert run_cli("migrate", SERVICE_DATABASE_URL=url).returncode == 0
    a, b, c = _key(url, "a"), _key(url, "b"), _key(url, "c")
    server = app_factory(
        url,
        SERVICE_MAX_RUNS_PER_PROJECT="1",
        SERVICE_MAX_QUEUED_RUNS="2",
        SERVICE_MAX_SSE_SUBSCRIBERS_PER_RESPONSE="1",
        SERVICE_MAX_BODY_BYTES="100000",
    ).start()
    long_run = {"input": "go on", "background": True, "max_output_tokens": LONG}
    first = _post(server.url, a, long_run)
    assert first.status_code == 200, first.text
    run_a = first.json()["id"]

    # A second run of the same project while the first is going: 429 with Retry-After.
    second = _post(server.url, a, long_run)
    error = _error(second, 429, "rate_limit_error", "too_many_concurrent_runs")
    assert "limit is 1" in error["message"] and int(second.headers["retry-after"]) >= 1

    # Another project fills the queue; a third project then finds the server full: 503.
    run_b = _post(server.url, b, long_run).json()["id"]
    full = _post(server.url, c, long_run)
    _error(full, 503, "server_error", "server_overloaded")
    assert int(full.headers["retry-after"]) >= 1

    # One event stream per response: the second subscriber is refused while the first is open.
    with httpx.stream(
        "GET",
        f"{server.url}/v1/responses/{run_a}",
        params={"stream": "true"},
        headers={"Authorization": f"Bearer {a}"},
        timeout=60,
    ) as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()  # kept: a dropped iterator closes the stream
        assert next(lines) == "event: response.created"
        refused = httpx.get(
            f"{server.url}/v1/responses/{run_a}",
            params={"stream": "true"},
            headers={"Authorization": f"Bearer {a}"},
            timeout=60,
        )
        _error(refused, 429, "rate_limit_error", "too_many_subscribers")
        assert refused.headers["retry-after"] == "1"
    for key, run in ((a, run_a), (b, run_b)):
        cancel = httpx.post(f"{server.url}/v1/responses/{run}/cancel", headers={"Authorization": f"Bearer {key}"})
        assert cancel.status_code == 200 and cancel.json()["status"] == "cancelled", cancel.text
    # Once closed, the stream's slot is free again (the replay of a cancelled run ends at once).
    replay = httpx.get(
        f"{server.url}/v1/responses/{run_a}", params={"stream": "true"}, headers={"Authorization": f"Bearer {a}"}
    )
    assert replay.status_code == 200

    # Sizes: the body, the prompt against the context window, max_output_tokens against it.
    _error(_post(server.url, c, {"input": "x" * 120000}), 413, "invalid_request_error", "payload_too_large")
    too_long = _post(server.url, c, {"input": "word " * 10000})
    error = _error(too_long, 400, "invalid_request_error", "context_length_exceeded")
    assert "tokens" in error["message"] and error["param"] == "input"
    too_many = _post(server.url, c, {"input": "hi", "max_output_tokens": 10**6})
    error = _error(too_many, 400, "invalid_request_error", "max_output_tokens_too_large")
    assert "1000000" in error["message"] and error["param"] == "max_output_tokens"


def test_limit_bookkeeping() -> None:
    """Unit checks of the pure parts: the bucket refills, subscriber slots are given back."""
    limiter = RequestRateLimiter(60)
    decisions = [limiter.check("k") for _ in range(61)]
    assert all(d.allowed for d in decisions[:60]) and not decisions[60].allowed
    assert 0 < decisions[60].retry_after <= 1.0
    limiter._buckets["k"].updated -= 2.0  # two seconds later: two more requests
    assert limiter.check("k").allowed and limiter.check("k").allowed and not limiter.check("k").allowed

    slots = SubscriberLimit(2)
    with slots.hold("r"), slots.hold("r"):
        assert slots.total() == 2
        with pytest.raises(Exception, match="open streams"), slots.hold("r"):
            pass
    assert slots.total() == 0 and slots.open == {}

    check_runs(project_runs=0, project_limit=1, all_runs=1, queue_limit=2)
    with pytest.raises(Exception, match="queued or generating"):
        check_runs(project_runs=0, project_limit=1, all_runs=2, queue_limit=2)
