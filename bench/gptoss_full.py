"""Batch-1 decode speed and memory of a whole gpt-oss model directory (e.g. the random real shape).

    python -m service model build-random --shape gpt-oss-20b DIR
    SERVICE_INTRA_OP_THREADS=2 .venv/bin/python -m bench.gptoss_full DIR [--threads 2] [--new 16]

Refuses to load when the machine's available memory is below the model's size plus 3 GB.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

from service.engine.base import SamplingParams
from service.engine.onnx_engine import OnnxEngine


def available_bytes() -> int:
    with open("/proc/meminfo") as meminfo:
        line = next(line for line in meminfo if line.startswith("MemAvailable"))
    return int(line.split()[1]) * 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("path", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new", type=int, default=16)
    args = parser.parse_args()
    size = sum(f.stat().st_size for f in args.path.iterdir() if f.is_file())
    avail = available_bytes()
    print(json.dumps({"size_gb": size / 1e9, "available_gb": avail / 1e9}), flush=True)
    if avail < size + 3e9:
        sys.exit("not enough available memory to load the model")
    started = time.perf_counter()
    engine = OnnxEngine(args.path, intra_op_threads=args.threads)
    load = time.perf_counter() - started
    engine.add_sequence("a", list(range(1000, 1064)), SamplingParams(max_new_tokens=args.new + 1, temperature=0.0))
    engine.step()  # the first token comes from the prefill
    started = time.perf_counter()
    for _ in range(args.new):
        engine.step()
    per_token = (time.perf_counter() - started) / args.new
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    figures = {"load_s": load, "decode_s_per_token": per_token, "decode_tok_s": 1 / per_token, "peak_rss_gb": peak}
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
