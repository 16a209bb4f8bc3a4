"""Prefill and decode speed on random-weight models: Qwen2.5-0.5B's shape, and the built-in model.

    .venv/bin/python -m bench.decode_speed [--work-dir DIR] [--threads 2] [--prompt 128] [--new 128]
        [--parts batch1,sweep,bandwidth] [--batches 1,2,4,8,16] [--sweep-new 32] [--no-looped] [--rounds 3]
        [--vocab harmony|native] [--genai-python PY] [--standard] [--block-size 32]

The Qwen shape is on the Harmony vocabulary (201,088 ids, what `model build-random --shape qwen2.5-0.5b`
writes and benchmarks serve) unless --vocab native (Qwen2.5's own 151,936).
Part 1, batch 1 (prefill tok/s over a --prompt-token prompt, decode tok/s over --new tokens):
  * OnnxEngine on the service's own int8 graph (contrib ops: GroupQueryAttention, MatMulNBits int8);
  * onnxruntime-genai's generator on that same model.onnx (through a genai_config.json);
  * onnxruntime-genai's generator on the model onnxruntime-genai's own builder makes from the same
    weights (`-p int8 -e cpu`, accuracy_level 4, block 32), and OnnxEngine on that model too.
Part 2, the batch sweep: aggregate decode tok/s (batch x tokens / time) with B sequences active,
  OnnxEngine stepping them in one run per token ("batched") vs one run per sequence ("looped",
  what step() did before batching), on the Qwen-shape model and on the built-in model.
Part 4 (--parts sampling): CPU ms that sampling a batch of logits rows costs per step, by parameters.
Part 3, bandwidth: bytes of weights one decoded token reads (every initializer once, one row of the
  embedding table) against a numpy copy's bandwidth: the batch-1 decode ceiling, and part 1's share of it.
All rows run interleaved, --rounds times, best of each reported: the 2-core machine is shared.
--block-size N builds the service's graph and the genai-built model with int8 blocks of N (default 32); row builds
the service's graph per-row int8 (MatMulIntegerToFloat) and genai's at 32, its default.

onnxruntime-genai's model builder needs torch, which is not a dependency of the service. It runs in a
separate bench-only venv, e.g.

    python3 -m venv .venv-bench && echo '*' > .venv-bench/.gitignore
    .venv-bench/bin/pip install numpy onnx onnx_ir onnxruntime onnxruntime-genai torch==2.13.0 \\
        safetensors transformers          # torch==2.13.0 is the local CPU wheel: never a bare `torch`

and this bench calls it as a subprocess (--genai-python, default .venv-bench/bin/python when it
exists, else this interpreter if it has torch); without it the genai-built rows are skipped. The HF
checkpoint it converts (Qwen2 config.json + model.safetensors, zero q/k/v biases, since Qwen2 has
them and our graph has none) is written here without torch. Everything is cached in --work-dir.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from service.engine.base import SamplingParams
from service.engine.builder import build_random_decoder
from service.engine.config import (
    INT8_BLOCK_SIZE,
    INT8_PER_ROW,
    DecoderConfig,
    int8_block_name,
    int8_block_or_default,
    parse_int8_block,
)
from service.engine.model_dir import ensure_builtin_model
from service.engine.model_files import find_model_file
from service.engine.onnx_engine import OnnxEngine
from service.engine.sampling import sample
from service.engine.shapes import shape_config
from service.engine.weights import random_weights

SEED = 0
ROOT = Path(__file__).resolve().parent.parent

# (prefill tok/s, decode tok/s, decode CPU ms per token), or why it did not run. CPU time (all of this
# process's threads) is what to compare on a machine other jobs share: wall time there measures the others.
# With more than one intra-op thread it includes ONNX Runtime's spinning; --threads 1 has none.
Result = tuple[float, float, float] | str


def ensure_model(path: Path, graph: str, config: DecoderConfig, block: int = INT8_BLOCK_SIZE) -> Path:
    if not (path / "config.json").exists():
        started = time.monotonic()
        extra = {"model_id": f"bench-{graph}"}
        build_random_decoder(path, config, SEED, quantize=True, graph=graph, extra=extra, block=block)
        print(f"built {path} in {time.monotonic() - started:.0f}s", flush=True)
    return path


def _block_suffix(block: int) -> str:
    """Model directories at the default block keep their names (caches of earlier runs stay valid)."""
    return "" if block == INT8_BLOCK_SIZE else f"-b{int8_block_name(block)}"


# -- the genai-built model -----------------------------------------------------------------------


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """The safetensors format by hand (u64 header length, JSON header, raw little-endian data)."""
    header: dict[str, object] = {}
    offset = 0
    for name, arr in tensors.items():
        assert arr.dtype == np.float32
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for arr in tensors.values():
            f.write(np.ascontiguousarray(arr).tobytes())


def write_hf_checkpoint(out: Path, c: DecoderConfig, seed: int) -> Path:
    """The same seeded weights as the service's graph, as a Qwen2ForCausalLM checkpoint."""
    if (out / "model.safetensors").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    w = random_weights(c, seed)
    for i in range(c.num_layers):  # Qwen2 always has q/k/v biases: zero, so the function is the same
        p = f"model.layers.{i}.self_attn."
        w[p + "q_proj.bias"] = np.zeros(c.num_heads * c.head_dim, np.float32)
        w[p + "k_proj.bias"] = np.zeros(c.num_kv_heads * c.head_dim, np.float32)
        w[p + "v_proj.bias"] = np.zeros(c.num_kv_heads * c.head_dim, np.float32)
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "max_position_embeddings": c.max_position,
        "rope_theta": c.rope_theta,
        "rms_norm_eps": c.rms_norm_eps,
        "tie_word_embeddings": c.tie_embeddings,
        "hidden_act": "silu",
        "bos_token_id": 0,
        "eos_token_id": c.vocab_size - 1,
        "torch_dtype": "float32",
        "use_sliding_window": False,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    write_safetensors(out / "model.safetensors", w)
    return out


def find_genai_python(arg: str | None) -> str | None:
    if arg:
        return arg
    bench_venv = ROOT / ".venv-bench" / "bin" / "python"
    if bench_venv.exists():
        return str(bench_venv)
    try:
        import torch  # noqa: F401

        return sys.executable
    except ImportError:
        return None


def ensure_genai_model(work_dir: Path, python: str, config: DecoderConfig, vocab: str, block: int) -> Path:
    out = work_dir / f"{vocab}-genai-int8{_block_suffix(block)}"
    if (out / "genai_config.json").exists():
        return out
    hf = write_hf_checkpoint(work_dir / f"{vocab}-hf-qwen2", config, SEED)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [python, "-m", "onnxruntime_genai.models.builder", "-m", str(hf), "-i", str(hf), "-o", str(tmp)]
    cmd += ["-p", "int8", "-e", "cpu", "-c", str(work_dir / "genai-cache")]
    cmd += ["--extra_options", "accuracy_level=4", f"block_size={block}"]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    # The last step (saving a tokenizer) fails on a checkpoint without one; the model is written by then.
    if not ((tmp / "genai_config.json").exists() and (tmp / "model.onnx").exists()):
        raise RuntimeError(f"genai builder failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    tmp.rename(out)
    (out / "config.json").write_text((hf / "config.json").read_text())  # so OnnxEngine can load it too
    print(f"built {out} with onnxruntime-genai's builder in {time.monotonic() - started:.0f}s", flush=True)
    return out


# -- timing ----------------------------------------------------------------------------------------


def bench_engine(model_dir: Path, threads: int, prompt: list[int], new: int) -> Result:
    eng = OnnxEngine(model_dir, intra_op_threads=threads)
    params = SamplingParams(max_new_tokens=new + 1, temperature=0.0, logprobs=False)  # genai computes none either
    eng.add_sequence("warm", prompt[:8], params)
    eng.step()
    eng.remove_sequence("warm")
    started = time.perf_counter()
    eng.add_sequence("s", prompt, params)
    while "s" in eng.prefilling_sequence_ids():  # steps prefill the prompt in chunks, then sample token 1
        eng.step()
    prefill = time.perf_counter() - started
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(new):  # each step samples one token and runs it through the model
        eng.step()
    decode, cpu = time.perf_counter() - started, time.process_time() - cpu
    eng.remove_sequence("s")
    return len(prompt) / prefill, new / decode, 1e3 * cpu / new


def bench_engine_batch(engine: OnnxEngine, batch: int, batched: bool, prompt_len: int, new: int) -> tuple[float, float]:
    """(aggregate decode tok/s, CPU ms per token) with `batch` sequences active (prefill not timed)."""
    rng = np.random.default_rng(batch)
    params = SamplingParams(max_new_tokens=new + 2, temperature=0.0, logprobs=False)
    engine.max_batch = batch if batched else 1
    for b in range(batch):
        engine.add_sequence(f"s{b}", [int(t) for t in rng.integers(0, engine.config.vocab_size, prompt_len)], params)
    while engine.prefilling_sequence_ids():  # prompts are prefilled in chunks over the first steps
        engine.step()
    engine.step()  # warm: first run at this batch size
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(new):
        engine.step()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    for b in range(batch):
        engine.remove_sequence(f"s{b}")
    return batch * new / elapsed, 1e3 * cpu / (batch * new)


def _set_genai_threads(model_dir: Path, threads: int) -> None:
    path = model_dir / "genai_config.json"
    cfg = json.loads(path.read_text())
    opts = cfg["model"]["decoder"].setdefault("session_options", {})
    opts.update({"intra_op_num_threads": threads, "inter_op_num_threads": 1})
    path.write_text(json.dumps(cfg, indent=2))


def time_genai(model_dir: Path, prompt: list[int], new: int) -> Result:
    try:
        import onnxruntime_genai as og
    except ImportError as exc:
        return f"onnxruntime-genai unavailable: {exc}"
    try:
        model = og.Model(str(model_dir))
        for warm in (True, False):
            params = og.GeneratorParams(model)
            length = len(prompt) + new + 1
            params.set_search_options(max_length=length, min_length=length, do_sample=False)
            gen = og.Generator(model, params)
            started = time.perf_counter()
            gen.append_tokens(np.array(prompt[:8] if warm else prompt, dtype=np.int32))
            prefill = time.perf_counter() - started
            started, cpu = time.perf_counter(), time.process_time()
            for _ in range(2 if warm else new):
                gen.generate_next_token()
            decode, cpu = time.perf_counter() - started, time.process_time() - cpu
            del gen
        return len(prompt) / prefill, new / decode, 1e3 * cpu / new
    except Exception as exc:  # report, do not fail the whole bench
        return f"onnxruntime-genai failed: {exc}"


def bench_genai_on_ours(model_dir: Path, c: DecoderConfig, threads: int, prompt: list[int], new: int) -> Result:
    """onnxruntime-genai's runtime on the service's own model.onnx, through a genai_config.json."""
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
        return time_genai(model_dir, prompt, new)
    finally:
        (model_dir / "genai_config.json").unlink(missing_ok=True)


def best_of(rounds: int, runs: dict[str, Callable[[], Result]]) -> dict[str, Result]:
    """Interleaved rounds, best of each: a shared 2-core machine makes single runs noisy."""
    best: dict[str, Result] = {}
    for _ in range(rounds):
        for name, fn in runs.items():
            result = fn()
            prev = best.get(name)
            if prev is None or isinstance(result, str):
                best[name] = result
            elif not isinstance(prev, str):
                best[name] = (max(prev[0], result[0]), max(prev[1], result[1]), min(prev[2], result[2]))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/decode-bench"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the best of each is reported")
    ap.add_argument("--batches", default="1,2,4,8,16", help="batch sweep sizes ('' to skip the sweep)")
    ap.add_argument("--sweep-new", type=int, default=32, help="decoded tokens per sequence in the sweep")
    ap.add_argument("--no-looped", action="store_true", help="sweep: skip the one-run-per-sequence rows")
    ap.add_argument("--vocab", choices=("harmony", "native"), default="harmony", help="Qwen shape's vocabulary")
    ap.add_argument("--genai-python", default=None, help="python with torch + onnxruntime-genai (the builder)")
    ap.add_argument("--no-genai-build", action="store_true", help="skip the genai-built model")
    ap.add_argument("--parts", default="batch1,sweep,bandwidth", help="tables: batch1 (incl. genai), sweep, bandwidth")
    ap.add_argument("--standard", action="store_true", help="also the standard-op graph (quantize_dynamic)")
    ap.add_argument(
        "--block-size",
        type=parse_int8_block,
        default=INT8_BLOCK_SIZE,
        help="int8 block size of the service's graph and of the genai-built model (the same for both; with row, "
        f"genai's builder, which has no per-row int8, gets {INT8_BLOCK_SIZE})",
    )
    args = ap.parse_args()
    args.block_size = int8_block_or_default(args.block_size)  # --block-size auto: what build-random picks here
    config = shape_config("qwen2.5-0.5b", args.vocab)
    prompt = [int(t) for t in np.random.default_rng(1).integers(0, config.vocab_size, args.prompt)]
    contrib_dir = args.work_dir / f"{args.vocab}-contrib-int8{_block_suffix(args.block_size)}"
    contrib = ensure_model(contrib_dir, "contrib", config, args.block_size)
    parts = set(args.parts.split(","))
    decode: Result = "not measured"
    if "batch1" in parts:
        decode = batch_one(args, config, contrib, prompt)["OnnxEngine, service int8 graph"]
    if "sweep" in parts:
        batch_sweep(args, contrib)
    if "bandwidth" in parts:
        bandwidth_share(args, contrib, decode)
    if "sampling" in parts:
        sampling_cost(config.vocab_size, max(int(b) for b in args.batches.split(",") if b.strip()))


def batch_one(args: argparse.Namespace, config: DecoderConfig, contrib: Path, prompt: list[int]) -> dict[str, Result]:
    runs: dict[str, Callable[[], Result]] = {
        "OnnxEngine, service int8 graph": lambda: bench_engine(contrib, args.threads, prompt, args.new),
        "genai runtime, service int8 graph": lambda: bench_genai_on_ours(
            contrib, config, args.threads, prompt, args.new
        ),
    }
    genai_python = None if args.no_genai_build else find_genai_python(args.genai_python)
    if genai_python:
        genai_block = INT8_BLOCK_SIZE if args.block_size == INT8_PER_ROW else args.block_size
        gdir = ensure_genai_model(args.work_dir, genai_python, config, args.vocab, genai_block)
        _set_genai_threads(gdir, args.threads)
        runs["genai runtime, genai-built int8 graph"] = lambda: time_genai(gdir, prompt, args.new)
        runs["OnnxEngine, genai-built int8 graph"] = lambda: bench_engine(gdir, args.threads, prompt, args.new)
    else:
        print("genai-built model skipped: no python with torch (see --genai-python)")
    if args.standard:
        std = ensure_model(args.work_dir / f"{args.vocab}-standard-int8", "standard", config)
        runs["OnnxEngine, standard graph (quantize_dynamic)"] = lambda: bench_engine(
            std, args.threads, prompt, args.new
        )
    best = best_of(args.rounds, runs)
    print(
        f"\nQwen2.5-0.5B shape ({config.vocab_size:,} vocab), batch 1, {args.prompt}-token prompt, {args.new} decoded,"
    )
    print(f"{args.threads} threads, best of {args.rounds} interleaved rounds (tok/s)")
    print(f"  {'':40s} {'prefill':>9s} {'decode':>8s} {'decode CPU ms/tok':>18s}")
    for name, result in best.items():
        if isinstance(result, str):
            print(f"  {name:40s} {result}")
        else:
            print(f"  {name:40s} {result[0]:9.1f} {result[1]:8.1f} {result[2]:18.1f}")
    return best


def batch_sweep(args: argparse.Namespace, contrib: Path) -> None:
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    engines = {
        "qwen2.5-0.5b shape": OnnxEngine(contrib, intra_op_threads=args.threads),
        "built-in": OnnxEngine(ensure_builtin_model(progress=False), intra_op_threads=args.threads),
    }
    sweep: dict[tuple[str, int, bool], tuple[float, float]] = {}
    for _ in range(args.rounds):
        for name, eng in engines.items():
            for b in batches:
                for batched in (True, False) if b > 1 and not args.no_looped else (True,):
                    tps, cpu = bench_engine_batch(eng, b, batched, args.prompt, args.sweep_new)
                    prev = sweep.get((name, b, batched), (0.0, float("inf")))
                    sweep[name, b, batched] = (max(prev[0], tps), min(prev[1], cpu))
    print(f"\nAggregate decode tok/s, B sequences of a {args.prompt}-token prompt, {args.sweep_new} decoded each,")
    print(f"{args.threads} threads, best of {args.rounds} interleaved rounds; batched = one run per step, looped =")
    print("one run per sequence; x B=1: batched tok/s over batch 1's, by wall time and by CPU time per token")
    head = f"  {'model':20s} {'B':>3s} {'batched':>9s} {'looped':>9s} {'speedup':>8s} {'x B=1':>7s}"
    print(head + f" {'CPU ms/tok':>11s} {'x B=1 CPU':>10s}")
    for name in engines:
        one = sweep.get((name, 1, True))
        for b in batches:
            bat, cpu = sweep[name, b, True]
            loop = sweep.get((name, b, False), (bat, cpu))[0]
            wall_x = f"{bat / one[0]:6.2f}x" if one else "-"
            cpu_x = f"{one[1] / cpu:9.2f}x" if one else "-"
            print(
                f"  {name:20s} {b:3d} {bat:9.1f} {loop:9.1f} {bat / loop:7.2f}x {wall_x:>7s} {cpu:11.2f} {cpu_x:>10s}"
            )


def copy_bandwidth(gib: float = 1.0, rounds: int = 5) -> float:
    """Bytes per second moved by a numpy copy of a `gib` GiB array (read + write), best of `rounds`."""
    src = np.ones(int(gib * (1 << 30)) // 4, dtype=np.float32)
    dst = np.empty_like(src)
    best = 0.0
    for _ in range(rounds):
        started = time.perf_counter()
        np.copyto(dst, src)
        best = max(best, 2 * src.nbytes / (time.perf_counter() - started))
    return best


def weight_bytes_per_token(model_dir: Path) -> tuple[int, int]:
    """(bytes of initializers one decode token reads, all initializer bytes): every weight once, except
    Gather tables (the embedding), of which one row per token is read."""
    model = onnx.load(str(find_model_file(model_dir)), load_external_data=False)
    sizes = {t.name: _tensor_bytes(t) for t in model.graph.initializer}
    gathered = {n.input[0] for n in model.graph.node if n.op_type == "Gather" and n.input[0] in sizes}
    per_token = 0
    for t in model.graph.initializer:
        if t.name in gathered:
            per_token += sizes[t.name] // max(1, t.dims[0])
        else:
            per_token += sizes[t.name]
    return per_token, sum(sizes.values())


def _tensor_bytes(t: onnx.TensorProto) -> int:
    count = int(np.prod(t.dims)) if t.dims else 1
    return count * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize


def bandwidth_share(args: argparse.Namespace, contrib: Path, decode: Result) -> None:
    """How close batch-1 decode is to the memory-bandwidth limit (weight bytes per token / copy bandwidth)."""
    per_token, total = weight_bytes_per_token(contrib)
    bw = copy_bandwidth()
    limit = bw / per_token
    print(f"\nWeights read per decoded token: {per_token / 1e6:.1f} MB (all initializers {total / 1e6:.1f} MB)")
    print(f"numpy copy of 1 GiB, best of 5: {bw / 1e9:.1f} GB/s (read + write) -> at most {limit:.1f} tok/s at batch 1")
    if not isinstance(decode, str):
        by_cpu = 1e3 / decode[2] * args.threads  # tok/s if the process had its threads' cores to itself
        print(f"batch-1 decode {decode[1]:.1f} tok/s = {decode[1] / limit:.0%} of that limit; by CPU time")
        print(f"({decode[2]:.1f} ms/token over {args.threads} thread(s)) {by_cpu:.1f} tok/s = {by_cpu / limit:.0%}")


def sampling_cost(vocab: int, batch: int, steps: int = 10) -> None:
    """CPU ms that sampling `batch` rows of `vocab` logits takes per step, by sampling parameters."""
    logits = (np.random.default_rng(0).standard_normal((batch, 1, vocab)) * 3).astype(np.float32)
    peaked = logits * np.float32(4)  # a confident model: the nucleus is a few tokens
    mixes = {
        "greedy": (logits, SamplingParams(1, temperature=0.0, logprobs=False)),
        "greedy, with the token's logprob": (logits, SamplingParams(1, temperature=0.0)),
        "temperature 1": (logits, SamplingParams(1, temperature=1.0, logprobs=False)),
        "temperature 1, with the token's logprob": (logits, SamplingParams(1, temperature=1.0)),
        "temperature 0.7, top_p 0.9 (flat)": (logits, SamplingParams(1, temperature=0.7, top_p=0.9, logprobs=False)),
        "temperature 0.7, top_p 0.9 (peaked)": (peaked, SamplingParams(1, temperature=0.7, top_p=0.9, logprobs=False)),
        "temperature 1, top_logprobs 5": (logits, SamplingParams(1, temperature=1.0, top_logprobs=5)),
    }
    print(f"\nSampling {batch} rows of {vocab:,} logits, CPU ms per step (mean of {steps})")
    for name, (rows, params) in mixes.items():
        started = time.process_time()
        for index in range(steps):
            for b in range(batch):
                sample(rows[b, -1], params, index)
        print(f"  {name:40s} {1e3 * (time.process_time() - started) / steps:6.1f}")


if __name__ == "__main__":
    main()
