"""Smoke test of the side-by-side bench against this server alone (tiny sizes; the report's shape, not timings)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import side_by_side


def test_side_by_side_writes_the_table_for_this_server_alone(tmp_path: Path, random_model_dir: Path) -> None:
    out = tmp_path / "side-by-side.md"
    results = side_by_side.run(
        clients=[1],
        prompt=24,
        new=6,
        threads=1,
        out=out,
        work_dir=tmp_path / "work",
        model="tiny",
        variants=("default",),
    )
    (result,) = results
    (sample,) = result.samples
    assert not result.peer and sample.clients == 1 and result.peak_rss > 0
    assert sample.tokens == 6 and sample.input_tokens > 24 and sample.seconds > 0 and len(sample.ttft) == 1

    lines = out.read_text().splitlines()
    header = next(line for line in lines if line.startswith("| server |"))
    columns = [cell.strip() for cell in header.strip("|").split("|")]
    assert columns == [column.format(c="1") for column in side_by_side.COLUMNS]
    (row,) = [line for line in lines if line.startswith("| this server, model tiny |")]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    numbers = [float(cell.replace(",", "")) for cell in cells[2:]]
    # prompt tokens, output tokens per response, tok/s, TTFT, ITL, peak RSS. ITL alone may be 0.0: deltas that one
    # commit flushes together reach the client in one read, a gap under 0.05 ms.
    assert len(numbers) == 6 and all(number > 0 for number in numbers[:4] + numbers[5:]) and numbers[4] >= 0
    assert numbers[1] == 6  # output tokens per response: the forced length
    # The peers were not given: skipped, each with a message, and no ratio table.
    assert "- llama.cpp: skipped (no --llama-server given)" in lines
    assert "- vLLM: skipped (no --vllm-python given)" in lines
    assert "No peer ran: no ratios." in lines
    assert re.match(r"\*\d{4}-\d\d-\d\d \d\d:\d\d UTC at \w+ · .+ · `python -m bench.side_by_side`\*", lines[2])


def test_prompt_texts_are_distinct_and_about_the_length_asked() -> None:
    texts = side_by_side.prompt_texts(3, 40)
    assert len(set(texts)) == 3 and all(t.startswith(f"request {i:03d}:") for i, t in enumerate(texts))
    encoding = side_by_side.load_harmony()
    assert all(40 <= len(encoding.encode(t, allowed_special=set())) <= 42 for t in texts)


def test_tree_rss_counts_this_process() -> None:
    assert side_by_side.tree_rss(side_by_side.os.getpid()) > 10 * 2**20


def test_vllm_alone_gets_tcmalloc_and_its_own_intel_openmp_and_no_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = tmp_path / "vllm"
    (venv / "bin").mkdir(parents=True)
    (venv / "lib").mkdir()
    python, iomp, tcmalloc = venv / "bin" / "python", venv / "lib" / "libiomp5.so", tmp_path / "libtcmalloc.so.4"
    for path in (python, iomp, tcmalloc):
        path.write_bytes(b"")
    monkeypatch.setattr(side_by_side, "TCMALLOC", (str(tmp_path / "absent.so"), str(tcmalloc)))
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    peer = side_by_side.vllm(python, tmp_path / "config", 8000, 16, 2, 1024)
    assert peer.env["LD_PRELOAD"] == f"{tcmalloc}:{iomp}"
    assert peer.env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    # Seeded requests crash vLLM 0.32's CPU sampler under chunked prefill: the body's seed is dropped (null).
    assert peer.extra["seed"] is None and peer.extra["ignore_eos"] is True
    # An exported LD_PRELOAD wins; nothing found, nothing set; llama.cpp never gets one.
    monkeypatch.setenv("LD_PRELOAD", "/opt/mine.so")
    assert side_by_side.vllm(python, tmp_path / "config", 8000, 16, 2, 1024).env["LD_PRELOAD"] == "/opt/mine.so"
    monkeypatch.delenv("LD_PRELOAD")
    iomp.unlink()
    tcmalloc.unlink()
    assert "LD_PRELOAD" not in side_by_side.vllm(python, tmp_path / "config", 8000, 16, 2, 1024).env
    llama = side_by_side.llama_cpp(tmp_path / "llama-server", tmp_path / "m.gguf", 8001, 16, 2, 1024)
    assert "LD_PRELOAD" not in llama.env
