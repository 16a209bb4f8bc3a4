"""Admission by memory: the number of active runs follows from KV-cache bytes per run and a budget."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from service.engine import admission
from service.engine.config import read_config
from service.engine.onnx_engine import OnnxEngine
from tests.api_helpers import client_for, sql_rows, wait_until_terminal
from tests.conftest import ServerProcess


def test_limit_is_what_the_budget_holds() -> None:
    assert admission.active_run_limit(100, 1000, None) == 10
    assert admission.active_run_limit(100, 1050, None) == 10
    assert admission.active_run_limit(100, 50, None) == 1  # one run always fits
    assert admission.active_run_limit(100, 1000, 4) == 4  # the cap, when set, bounds it
    assert admission.active_run_limit(None, 1000, None) == admission.FALLBACK_ACTIVE_RUNS
    assert admission.active_run_limit(None, 1000, 3) == 3


def test_default_budget_is_a_share_of_the_machine() -> None:
    memory = admission.machine_memory_bytes()
    assert memory > 0
    assert admission.default_budget_bytes() == int(memory * admission.DEFAULT_BUDGET_SHARE)
    assert admission.active_run_limit(memory, None, None) == 1


def test_engine_reports_its_kv_cache_per_sequence(random_model_dir: Path) -> None:
    engine = OnnxEngine(random_model_dir, intra_op_threads=1)
    config = read_config(random_model_dir).decoder
    itemsize = np.dtype(engine.layout.kv_dtype).itemsize
    per_position = 2 * config.num_layers * config.num_kv_heads * config.head_dim * itemsize
    assert engine.kv_bytes_per_sequence() == per_position * engine.max_context
    assert isinstance(engine, admission.SizedKvCache)


def _first_and_last_positions(database_url: str, response_id: str) -> tuple[int, int]:
    rows = sql_rows(
        database_url,
        "SELECT min(position), max(position) FROM events WHERE response_id = :r AND sequence_number > 0",
        r=response_id,
    )
    return int(rows[0][0]), int(rows[0][1])


def test_runs_beyond_the_budget_wait_in_the_queue(
    tmp_path: Path, app_factory: Callable[..., ServerProcess], random_model_dir: Path
) -> None:
    per_run = OnnxEngine(random_model_dir, intra_op_threads=1).kv_bytes_per_sequence()
    url = f"sqlite+aiosqlite:///{tmp_path / 'service.db'}"
    # Queue three runs behind one slot (run 0, long, starts; 1 and 2 wait), then restart with room for two KV
    # caches and a half: the first claim takes runs 0 and 1 together, and run 2 waits until run 1 has ended.
    # Run 0 is too long to end by itself meanwhile (whatever the machine's speed) and is cancelled at the end.
    server = app_factory(url, SERVICE_MAX_ACTIVE_RUNS="1").start()
    client = client_for(server.url)
    ids = [
        client.responses.create(input=f"run {n}", max_output_tokens=4000 if n == 0 else 300, background=True).id
        for n in range(3)
    ]
    server.stop()
    server = app_factory(url, SERVICE_KV_CACHE_BUDGET_BYTES=str(per_run * 5 // 2)).start()
    client = client_for(server.url)
    for response_id in ids[1:]:
        assert wait_until_terminal(client, response_id).status == "incomplete"
    client.responses.cancel(ids[0])
    assert wait_until_terminal(client, ids[0]).status == "cancelled"
    spans = [_first_and_last_positions(url, response_id) for response_id in ids]
    # The log's positions are commit order: runs 0 and 1 interleave, run 2 starts after run 1 has ended.
    assert spans[1][0] < spans[0][1]
    assert spans[2][0] > spans[1][1]
