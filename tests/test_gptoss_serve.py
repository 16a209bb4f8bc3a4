"""A gpt-oss-shaped model (MoE, sinks, sliding window, YaRN; Harmony vocabulary) served end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.api_helpers import assert_well_formed_stream, client_for, final_text, text_from_deltas
from tests.conftest import ROOT, ServerProcess


@pytest.fixture(scope="module")
def gptoss_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("models") / "gpt-oss-tiny"
    cmd = [sys.executable, "-m", "service", "model", "build-random", "--shape", "gpt-oss-tiny", str(out)]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, env={**os.environ, "SERVICE_INTRA_OP_THREADS": "1"})
    return out


def test_model_info_describes_gptoss(gptoss_dir: Path) -> None:
    cmd = [sys.executable, "-m", "service", "model", "info", str(gptoss_dir)]
    info = json.loads(subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout)
    assert info["graph"] == "gpt_oss" and info["chat_format"] == "harmony"
    assert info["mixture_of_experts"]["experts"] == 8 and info["mixture_of_experts"]["top_k"] == 2
    assert info["mixture_of_experts"]["expert_op"] == "QMoE" and info["mixture_of_experts"]["expert_bits"] == 4
    assert info["attention"] == {
        "op": "GroupQueryAttention",
        "sinks": True,
        "sliding_window": 16,
        "sliding_layers": [0, 2],
        "window_sized_cache_layers": [0, 2],
    }


def test_gptoss_serves_plain_streaming_and_follow_ups(
    gptoss_dir: Path, database_url: str, app_factory: Callable[..., ServerProcess]
) -> None:
    server = app_factory(database_url, SERVICE_MODEL=str(gptoss_dir)).start()
    client = client_for(server.url)
    assert [m.id for m in client.models.list().data] == ["random-gpt-oss-tiny"]
    response = client.responses.create(input="Hello", instructions="Be brief.", max_output_tokens=40)
    assert response.model == "random-gpt-oss-tiny" and response.status in ("completed", "incomplete")
    assert response.usage and response.usage.input_tokens > 16  # the prompt alone crosses the window
    events = [e.model_dump() for e in client.responses.create(input="Stream it", max_output_tokens=40, stream=True)]
    assert_well_formed_stream(events)
    assert final_text(events[-1]["response"]) == text_from_deltas(events)
    seeded = {"input": "Hello", "instructions": "Be brief.", "max_output_tokens": 40, "extra_body": {"seed": 7}}
    again = client.responses.create(**seeded)  # type: ignore[call-overload]
    same = client.responses.create(**seeded)  # type: ignore[call-overload]
    assert [i.model_dump(exclude={"id"}) for i in again.output] == [i.model_dump(exclude={"id"}) for i in same.output]
    follow = client.responses.create(input="More", previous_response_id=response.id, max_output_tokens=5)
    assert follow.usage and follow.usage.input_tokens > response.usage.input_tokens
