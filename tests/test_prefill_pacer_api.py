"""Prefill paced by time (SERVICE_PREFILL_STALL_RATIO) through the real server and the official client:
a newcomer that arrives while another run decodes is prefilled in paced parts (the metric counts the
steps the pacer held back) and samples exactly what it samples alone. The pacer's arithmetic and the
engine's chunking are tested without a server in tests/test_engine_prefill.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.api_helpers import client_for
from tests.conftest import ServerProcess

ServerFactory = Callable[..., ServerProcess]

# ~200 prompt tokens with the system message: several paced parts of 32 (the pacer's floor) beside a decoding
# run, one step of the 256-token budget alone.
NEWCOMER = "Tell me about the rivers and the hills and the towns along them. " * 10


def _paced_steps(url: str) -> float:
    reply = httpx.get(url + "/metrics", timeout=30)
    assert reply.status_code == 200
    samples = {
        sample.name: sample.value for family in text_string_to_metric_families(reply.text) for sample in family.samples
    }
    return samples["service_prefill_paced_steps"]


def _without_ids(output: list[Any]) -> list[dict[str, Any]]:
    return [{key: value for key, value in item.model_dump().items() if key != "id"} for item in output]


def test_a_newcomer_beside_a_decoding_run_is_paced_and_samples_what_it_samples_alone(
    database_url: str, app_factory: ServerFactory
) -> None:
    # Ratio 0.01: a hundredth of a decode step is far under the 32-token floor on any machine, so once both
    # costs are measured a paced step prefills at most 32 tokens (no dependence on this machine's speed).
    # Without the prefix cache the second newcomer prefills its whole prompt again.
    server = app_factory(database_url, SERVICE_PREFILL_STALL_RATIO="0.01", SERVICE_PREFIX_CACHE_BYTES="0").start()
    client = client_for(server.url)
    newcomer = {"model": "random-harmony-tiny", "input": NEWCOMER, "max_output_tokens": 24, "extra_body": {"seed": 5}}

    alone = client.responses.create(**newcomer)  # type: ignore[call-overload]
    assert alone.status in ("completed", "incomplete") and alone.usage is not None
    assert alone.usage.input_tokens > 64
    assert _paced_steps(server.url) == 0  # nobody was decoding: the whole prompt in one step

    long_run = client.responses.create(
        model="random-harmony-tiny",
        input="Go on for a long while",
        max_output_tokens=4000,
        background=True,
        stream=True,
        extra_body={"seed": 1},
    )
    long_id = None
    for event in long_run:  # until it decodes: its first token is in the log
        if event.type == "response.created":
            long_id = event.response.id
        if event.type.endswith(".delta"):
            break
    assert long_id is not None
    try:
        beside = client.responses.create(**newcomer)  # type: ignore[call-overload]
        still_running = client.responses.retrieve(long_id).status == "in_progress"
    finally:
        long_run.close()
        httpx.post(f"{server.url}/v1/responses/{long_id}/cancel", timeout=30)  # 400 if it already ended

    assert still_running  # the newcomer was prefilled beside a decoding run
    assert beside.status == alone.status
    assert beside.usage is not None and beside.usage.output_tokens == alone.usage.output_tokens
    assert _without_ids(beside.output) == _without_ids(alone.output)
    assert _paced_steps(server.url) >= alone.usage.input_tokens // 32  # its prompt in parts of 32 or fewer
