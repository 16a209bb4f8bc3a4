"""Decode speed of gpt-oss-20b's real shape (random weights, int4 experts, int8 dense) on this CPU.

    .venv/bin/python -m bench.gptoss_speed [--work-dir DIR] [--layers 1,3] [--threads 2] [--new 32]

The whole 24-layer model (~13 GB of int4/int8 weights) is built by
`python -m service model build-random --shape gpt-oss-20b DIR`; building it holds the weights twice
(numpy and protobuf), more than a 24 GiB machine shared with others can spare. So this bench builds the
real width with fewer layers (--layers), measures batch-1 decode time per token for each, fits
time = fixed + per_layer x layers, and extrapolates to 24 layers. It reports, beside it, the bound set
by memory bandwidth: bytes a token must read (attention, router, top-4 experts, head; one embedding
row) over a measured copy bandwidth. Also the process's peak RSS and the model's size on disk.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from service.engine.base import SamplingParams
from service.engine.info import model_info
from service.engine.onnx_engine import OnnxEngine

ROOT = Path(__file__).resolve().parent.parent
FULL_LAYERS = 24


def build(path: Path, layers: int) -> Path:
    if not (path / "config.json").exists():
        cmd = [sys.executable, "-m", "service", "model", "build-random", "--shape", "gpt-oss-20b"]
        subprocess.run([*cmd, "--layers", str(layers), str(path)], cwd=ROOT, check=True)
    return path


def decode_seconds_per_token(path: Path, threads: int, new: int, rounds: int) -> float:
    engine = OnnxEngine(path, intra_op_threads=threads)
    best = float("inf")
    for _ in range(rounds):
        engine.add_sequence("a", list(range(1000, 1064)), SamplingParams(max_new_tokens=new + 1, temperature=0.0))
        engine.step()  # the first token comes from the prefill
        started = time.perf_counter()
        for _ in range(new):
            engine.step()
        best = min(best, (time.perf_counter() - started) / new)
        engine.remove_sequence("a")
    return best


def copy_bandwidth() -> float:
    """Bytes per second moved by a large numpy copy (read + write), best of 5."""
    src = np.ones(1 << 28, dtype=np.uint8)  # 256 MiB
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - started)
    return 2 * src.nbytes / best


def bytes_per_token(layers: int) -> float:
    """What one decoded token reads of gpt-oss-20b's weights (int4 experts and int8 dense, block 32 fp32 scales)."""
    h, d, heads, kv, inter, experts, top_k, vocab = 2880, 64, 64, 8, 2880, 32, 4, 201_088
    int8 = 1 + 4 / 32
    int4 = 0.5 + 4 / 32
    attn = h * d * (heads + 2 * kv) * int8 + heads * d * h * int8
    router = experts * h * 4
    expert = 3 * h * inter * int4
    return layers * (attn + router + top_k * expert) + vocab * h * int8 + h * 4


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work-dir", type=Path, default=ROOT / ".cache" / "bench-gptoss")
    parser.add_argument("--layers", default="1,3")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the built models")
    args = parser.parse_args()
    results = {}
    for layers in [int(n) for n in args.layers.split(",")]:
        path = build(args.work_dir / f"gpt-oss-20b-{layers}l", layers)
        info = model_info(path)
        seconds = decode_seconds_per_token(path, args.threads, args.new, args.rounds)
        results[layers] = {
            "decode_s_per_token": seconds,
            "decode_tok_s": 1 / seconds,
            "size_bytes": info["size_bytes"],
            "parameters": info["parameters"],
            "active_parameters": info["active_parameters"],
        }
        print(json.dumps({"layers": layers, **results[layers]}), flush=True)
        if not args.keep:
            shutil.rmtree(path)
    counts = sorted(results)
    low, high = counts[0], counts[-1]
    per_layer = (results[high]["decode_s_per_token"] - results[low]["decode_s_per_token"]) / max(high - low, 1)
    fixed = results[low]["decode_s_per_token"] - per_layer * low
    full = fixed + per_layer * FULL_LAYERS
    bandwidth = copy_bandwidth()
    size_per_layer = (results[high]["size_bytes"] - results[low]["size_bytes"]) / max(high - low, 1)
    report = {
        "threads": args.threads,
        "per_layer_s": per_layer,
        "fixed_s": fixed,
        "extrapolated_24_layer_decode_tok_s": 1 / full,
        "copy_bandwidth_gb_s": bandwidth / 1e9,
        "bytes_per_token_24_layers_gb": bytes_per_token(FULL_LAYERS) / 1e9,
        "bandwidth_bound_tok_s": bandwidth / bytes_per_token(FULL_LAYERS),
        "extrapolated_24_layer_size_gb": (results[low]["size_bytes"] + size_per_layer * (FULL_LAYERS - low)) / 1e9,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9,
        "measured": results,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
