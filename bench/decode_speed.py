"""Prefill and decode speed at batch 1 on a random-weight model of Qwen2.5-0.5B's shape.

    .venv/bin/python -m bench.decode_speed [--work-dir DIR] [--threads 2] [--prompt 128] [--new 128] [--standard]

Builds (once, cached in --work-dir) the service's own int8 model (contrib ops, MatMulNBits int8),
times OnnxEngine, and times onnxruntime-genai's generator on the same model.onnx through a
genai_config.json. onnxruntime-genai's own builder needs torch (not installed here), so a
genai-built model of the same weights is not part of this run. --standard also times the
standard-op graph quantized with quantize_dynamic (slow to build).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from service.engine.base import SamplingParams
from service.engine.builder import build_random_decoder
from service.engine.cli import SHAPES
from service.engine.onnx_engine import OnnxEngine

CONFIG = SHAPES["qwen2.5-0.5b"]
SEED = 0


def ensure_model(path: Path, graph: str) -> Path:
    if not (path / "config.json").exists():
        started = time.monotonic()
        build_random_decoder(path, CONFIG, SEED, quantize=True, graph=graph, extra={"model_id": f"bench-{graph}"})
        print(f"built {path} in {time.monotonic() - started:.0f}s")
    return path


def bench_engine(model_dir: Path, threads: int, prompt: list[int], new: int) -> tuple[float, float]:
    eng = OnnxEngine(model_dir, intra_op_threads=threads)
    params = SamplingParams(max_new_tokens=new + 1, temperature=0.0)
    eng.add_sequence("warm", prompt[:8], params)
    eng.step()
    eng.remove_sequence("warm")
    started = time.perf_counter()
    eng.add_sequence("s", prompt, params)
    prefill = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(new):  # each step samples one token and runs it through the model
        eng.step()
    decode = time.perf_counter() - started
    eng.remove_sequence("s")
    return len(prompt) / prefill, new / decode


def bench_genai(model_dir: Path, threads: int, prompt: list[int], new: int) -> tuple[float, float] | str:
    try:
        import onnxruntime_genai as og
    except ImportError as exc:
        return f"onnxruntime-genai unavailable: {exc}"
    c = CONFIG
    cfg = {
        "model": {
            "type": "llama",
            "context_length": c.max_position,
            "vocab_size": c.vocab_size,
            "bos_token_id": 0,
            "eos_token_id": c.vocab_size - 1,
            "pad_token_id": 0,
            "decoder": {
                "filename": "model.onnx",
                "hidden_size": c.hidden_size,
                "head_size": c.head_dim,
                "num_attention_heads": c.num_heads,
                "num_key_value_heads": c.num_kv_heads,
                "num_hidden_layers": c.num_layers,
                "session_options": {"intra_op_num_threads": threads, "inter_op_num_threads": 1, "provider_options": []},
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
            },
        },
        "search": {
            "max_length": c.max_position,
            "past_present_share_buffer": True,
            "do_sample": False,
            "num_beams": 1,
            "min_length": 0,
        },
    }
    (model_dir / "genai_config.json").write_text(json.dumps(cfg, indent=2))
    try:
        model = og.Model(str(model_dir))
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + new + 1, min_length=len(prompt) + new + 1)
        gen = og.Generator(model, params)
        started = time.perf_counter()
        gen.append_tokens(np.array(prompt, dtype=np.int32))
        prefill = time.perf_counter() - started
        started = time.perf_counter()
        for _ in range(new):
            gen.generate_next_token()
        decode = time.perf_counter() - started
        return len(prompt) / prefill, new / decode
    except Exception as exc:  # report, do not fail the whole bench
        return f"onnxruntime-genai failed: {exc}"
    finally:
        (model_dir / "genai_config.json").unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/decode-bench"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--standard", action="store_true")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the best of each is reported")
    args = ap.parse_args()
    prompt = [int(t) for t in np.random.default_rng(1).integers(0, CONFIG.vocab_size, args.prompt)]
    contrib = ensure_model(args.work_dir / "contrib-int8", "contrib")
    runs = {
        "OnnxEngine contrib (GQA + MatMulNBits int8)": lambda: bench_engine(contrib, args.threads, prompt, args.new),
        "onnxruntime-genai runtime, same model.onnx": lambda: bench_genai(contrib, args.threads, prompt, args.new),
    }
    if args.standard:
        std = ensure_model(args.work_dir / "standard-int8", "standard")
        runs["OnnxEngine standard (quantize_dynamic int8)"] = lambda: bench_engine(std, args.threads, prompt, args.new)
    # Interleaved rounds, best of each: a shared 2-core machine makes single runs noisy.
    best: dict[str, tuple[float, float] | str] = {}
    for _ in range(args.rounds):
        for name, fn in runs.items():
            result = fn()
            prev = best.get(name)
            if isinstance(result, str) or prev is None or isinstance(prev, str):
                best[name] = result if prev is None or isinstance(result, str) else prev
            else:
                best[name] = (max(prev[0], result[0]), max(prev[1], result[1]))
    rows = list(best.items())
    print(f"batch 1, {args.prompt}-token prompt, {args.new} decoded, {args.threads} threads, best of {args.rounds}")
    for name, result in rows:
        if isinstance(result, str):
            print(f"  {name}: {result}")
        else:
            print(f"  {name}: prefill {result[0]:.1f} tok/s, decode {result[1]:.1f} tok/s")


if __name__ == "__main__":
    main()
