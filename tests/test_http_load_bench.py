"""Smoke test of the HTTP load bench harness (tiny sizes; it checks the report's shape, never timings)."""

from __future__ import annotations

from pathlib import Path

from bench import http_load


def test_http_load_writes_a_table_and_a_plot(tmp_path: Path, random_model_dir: Path) -> None:
    samples = http_load.run(
        ["tiny"],
        [1, 2],
        prompt=16,
        new=16,
        threads=1,
        out=tmp_path / "out",
        work_dir=tmp_path / "work",
        turns=2,
        think=(0.0, 0.2),
        steady_requests=3,
    )
    paths = [(s.path, s.clients) for s in samples]
    assert paths == [("http", 1), ("http", 2), ("steady", 1), ("steady", 2), ("engine", 1), ("engine", 2)]
    for sample in samples:
        # every client saw a first token (in the closed loop, of each request after its warm-up)
        assert len(sample.ttft) == sample.clients * (2 if sample.path == "steady" else 1)
        assert sample.tokens >= sample.clients and sample.seconds > 0
    table = (tmp_path / "out" / "http_load.md").read_text().splitlines()
    rows = [line for line in table if line.startswith("| tiny |")]
    assert len(rows) == 6 + 6 and all(line.count("|") == 12 for line in rows[:6])
    conversations = [line.split(" | ")[1:3] for line in rows[6:]]  # (prefix cache, think) per conversation
    warmed = "on, warmed while decoding"
    assert conversations == [[c, t] for c in ("on", warmed, "off") for t in ("0", "0.2")]
    assert all(line.count("|") == 8 for line in rows[6:])  # think, turn 1, turn 2, ratio, decode rates
    assert (tmp_path / "out" / "http_load.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_prompts_are_distinct_and_long_enough(random_model_dir: Path) -> None:
    texts = http_load.prompt_texts(random_model_dir, 3, 40)
    assert len(set(texts)) == 3
