"""Issue 37's measured promise, through one real server: `/health` answers within a second while a 4 MB body
of one character, a `^a{40000}$` schema and a sandboxed program printing 100 MB are all in flight.

The model is a scripted decoder (service/engine/scripted.py), so the code call is exactly the one wanted; the
tokenizer, the grammar compiler, the sandbox and the server are the real ones."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.engine.scripted import parse_rules, write_scripted_model
from tests.conftest import ServerProcess, new_sandbox_root

PRINT = '<|channel|>commentary to=python<|message|>print("x" * 100_000_000)<|call|>'
RULES = [
    {"when": ["print a lot", "<|call|>"], "script": "<|channel|>final<|message|>Done.<|return|>"},
    {"when": ["print a lot"], "script": PRINT},
    {"script": "<|channel|>final<|message|>Hi.<|return|>"},
]


@pytest.fixture(scope="module")
def scripted_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hostile") / "model"
    write_scripted_model(out, parse_rules(json.dumps(RULES)))
    return out


def _timed(results: dict[str, Any], name: str, call: Callable[[], httpx.Response]) -> threading.Thread:
    def run() -> None:
        started = time.monotonic()
        response = call()
        results[name] = (response.status_code, response.json(), time.monotonic() - started)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_health_answers_while_hostile_requests_are_in_flight(scripted_dir: Path, tmp_path: Path) -> None:
    sandbox = new_sandbox_root() / "c"
    server = ServerProcess(
        f"sqlite+aiosqlite:///{tmp_path / 'hostile.db'}",
        tmp_path / "server.log",
        SERVICE_MODEL=str(scripted_dir),
        SERVICE_SANDBOX_DIR=str(sandbox),
    ).start()
    try:
        url = f"{server.url}/v1/responses"
        # Warm what the first request of each kind builds (the grammar tokenizer, the sandbox's cgroup probe).
        warm = httpx.post(url, json={"model": "scripted", "input": "hello", "max_output_tokens": 8}, timeout=60)
        assert warm.status_code == 200, warm.text
        schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^a{40000}$"}}}
        text = {"format": {"type": "json_schema", "name": "s", "schema": schema, "strict": False}}
        bodies = {
            "body": {"model": "scripted", "input": "a" * 4_000_000},
            "grammar": {"model": "scripted", "input": "x", "text": text},
            "print": {
                "model": "scripted",
                "input": "print a lot",
                "max_output_tokens": 200,
                "include": ["code_interpreter_call.outputs"],
                "tools": [{"type": "code_interpreter", "container": {"type": "auto"}}],
            },
        }
        results: dict[str, Any] = {}
        threads = [
            _timed(results, name, lambda body=body: httpx.post(url, json=body, timeout=300))  # type: ignore[misc]
            for name, body in bodies.items()
        ]
        slowest = 0.0
        polls = 0
        while any(thread.is_alive() for thread in threads):
            started = time.monotonic()
            assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200
            slowest = max(slowest, time.monotonic() - started)
            polls += 1
            time.sleep(0.05)
        for thread in threads:
            thread.join()
    finally:
        server.stop()
    timings = {name: round(elapsed, 2) for name, (_, _, elapsed) in results.items()}
    print(f"slowest /health {slowest:.3f} s over {polls} polls; requests (s): {timings}")
    assert polls >= 3, results
    assert slowest < 1.0, (slowest, {name: (status, elapsed) for name, (status, _, elapsed) in results.items()})
    status, body, _ = results["body"]
    assert status == 400 and body["error"]["code"] == "context_length_exceeded", body
    status, body, _ = results["grammar"]
    assert status == 400 and body["error"]["code"] == "grammar_too_complex", body
    status, body, _ = results["print"]
    assert status == 200, body
    call = next(item for item in body["output"] if item["type"] == "code_interpreter_call")
    logs = call["outputs"][0]["logs"]
    assert len(logs) < 100_000 and "[output truncated]" in logs, logs[-200:]
    assert body["output"][-1]["content"][0]["text"] == "Done."
