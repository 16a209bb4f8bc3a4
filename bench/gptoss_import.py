"""gpt-oss-20b's real shape from a checkpoint in the original layout: import time and memory, then the imported
model's prefill and decode speed.

    .venv/bin/python -m bench.gptoss_import write CKPT [--layers 24]     # random MXFP4 checkpoint, ~13.8 GB
    /usr/bin/time -v .venv/bin/python -m bench.gptoss_import import CKPT OUT [--bits 4]
    .venv/bin/python -m bench.gptoss_import speed OUT [--prompt 6000] [--new 16] [--threads 2]

`write` streams each tensor into its safetensors file as it is drawn (bf16 weights, uint8 MXFP4 blocks and
E8M0 scales, config.json as openai/gpt-oss-20b's; three shards and an index, as the download has), so it
never holds the model. `speed` times the prefill of a `--prompt`-token prompt (to its first token), `--new`
decoded tokens, and a second turn: the same conversation with the reply and 32 new tokens appended (the
prefix cache holds the first turn's rows where the graph allows it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import ml_dtypes
import numpy as np

REAL_CONFIG = {
    "architectures": ["GptOssForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "eos_token_id": 200002,
    "experts_per_token": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2880,
    "initial_context_length": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 2880,
    "max_position_embeddings": 131072,
    "model_type": "gpt_oss",
    "num_attention_heads": 64,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 24,
    "num_key_value_heads": 8,
    "num_local_experts": 32,
    "output_router_logits": False,
    "pad_token_id": 199999,
    "quantization_config": {
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
        "quant_method": "mxfp4",
    },
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": False,
    },
    "rope_theta": 150000,
    "router_aux_loss_coef": 0.9,
    "sliding_window": 128,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "transformers_version": "4.55.0.dev0",
    "use_cache": True,
    "vocab_size": 201088,
}
ROWS = 8192  # rows of a 2-D tensor drawn at once

Maker = Callable[[np.random.Generator], Iterator[np.ndarray]]  # yields a tensor's bytes in row order


def _normal(rows: int, cols: int, std: float, mean: float = 0.0) -> Maker:
    def make(rng: np.random.Generator) -> Iterator[np.ndarray]:
        for start in range(0, rows, ROWS):
            n = min(ROWS, rows - start)
            chunk = rng.standard_normal((n, cols), dtype=np.float32) * np.float32(std) + np.float32(mean)
            yield chunk.astype(ml_dtypes.bfloat16)

    return make


def _bytes(count: int, low: int, high: int) -> Maker:
    def make(rng: np.random.Generator) -> Iterator[np.ndarray]:
        step = 1 << 28
        for start in range(0, count, step):
            yield rng.integers(low, high, min(step, count - start), dtype=np.uint8)

    return make


def checkpoint_tensors(cfg: dict[str, object]) -> list[tuple[str, str, tuple[int, ...], Maker]]:
    """(name, safetensors dtype, shape, maker) of every tensor of openai/gpt-oss-20b's checkpoint layout."""
    c = {k: int(v) for k, v in cfg.items() if isinstance(v, int) and not isinstance(v, bool)}
    h, d, e, inter, vocab = (
        c["hidden_size"],
        c["head_dim"],
        c["num_local_experts"],
        c["intermediate_size"],
        c["vocab_size"],
    )
    heads, kv = c["num_attention_heads"], c["num_key_value_heads"]
    out: list[tuple[str, str, tuple[int, ...], Maker]] = [
        ("model.embed_tokens.weight", "BF16", (vocab, h), _normal(vocab, h, 1.0)),
        ("model.norm.weight", "BF16", (h,), _normal(1, h, 0.1, 1.0)),
        ("lm_head.weight", "BF16", (vocab, h), _normal(vocab, h, h**-0.5)),
    ]
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        out += [
            (p + "input_layernorm.weight", "BF16", (h,), _normal(1, h, 0.1, 1.0)),
            (p + "post_attention_layernorm.weight", "BF16", (h,), _normal(1, h, 0.1, 1.0)),
            (p + "self_attn.sinks", "BF16", (heads,), _normal(1, heads, 1.0)),
            (p + "mlp.router.weight", "BF16", (e, h), _normal(e, h, h**-0.5)),
            (p + "mlp.router.bias", "BF16", (e,), _normal(1, e, 0.5)),
            (p + "mlp.experts.gate_up_proj_bias", "BF16", (e, 2 * inter), _normal(e, 2 * inter, 0.02)),
            (p + "mlp.experts.down_proj_bias", "BF16", (e, h), _normal(e, h, 0.02)),
        ]
        for m, rows in (("q", heads * d), ("k", kv * d), ("v", kv * d)):
            out.append((p + f"self_attn.{m}_proj.weight", "BF16", (rows, h), _normal(rows, h, h**-0.5)))
            out.append((p + f"self_attn.{m}_proj.bias", "BF16", (rows,), _normal(1, rows, 0.02)))
        out.append((p + "self_attn.o_proj.weight", "BF16", (h, heads * d), _normal(h, heads * d, (heads * d) ** -0.5)))
        out.append((p + "self_attn.o_proj.bias", "BF16", (h,), _normal(1, h, 0.02)))
        for proj, n, k in (("gate_up_proj", 2 * inter, h), ("down_proj", h, inter)):
            blocks = (e, n, k // 32, 16)
            # Uniform codes (RMS 2.9) at 2^-6..2^-5: weights of std ~k^-0.5 for k = 2880.
            out.append((p + f"mlp.experts.{proj}_blocks", "U8", blocks, _bytes(int(np.prod(blocks)), 0, 256)))
            out.append((p + f"mlp.experts.{proj}_scales", "U8", blocks[:3], _bytes(int(np.prod(blocks[:3])), 121, 123)))
    return out


_SIZES = {"BF16": 2, "U8": 1}


def write_safetensors(path: Path, tensors: list[tuple[str, str, tuple[int, ...], Maker]], seed: int) -> None:
    """The safetensors format (8-byte header length, JSON header, data) written tensor by tensor."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape, _ in tensors:
        size = int(np.prod(shape)) * _SIZES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for index, (name, _, _, make) in enumerate(tensors):
            for chunk in make(np.random.default_rng([seed, index])):
                f.write(np.ascontiguousarray(chunk).view(np.uint8).data)
            if name.endswith("down_proj_scales"):
                print(f"  {name}", flush=True)


def write_checkpoint(out: Path, layers: int, seed: int = 0) -> None:
    out.mkdir(parents=True, exist_ok=True)
    cfg = {**REAL_CONFIG, "num_hidden_layers": layers}
    cfg["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 199998, "do_sample": True, "eos_token_id": [200002, 199999, 200012]}) + "\n"
    )
    tensors = checkpoint_tensors(cfg)
    shards = [
        tensors[: len(tensors) // 3],
        tensors[len(tensors) // 3 : 2 * len(tensors) // 3],
        tensors[2 * len(tensors) // 3 :],
    ]
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"model-{i:05d}-of-{len(shards) - 1:05d}.safetensors"
        write_safetensors(out / name, shard, seed + i)
        weight_map.update({t[0]: name for t in shard})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))


def import_checkpoint(src: Path, out: Path, bits: int, max_context: int | None) -> None:
    from service.engine.importers.gpt_oss import import_gpt_oss

    started = time.perf_counter()
    import_gpt_oss(
        src,
        out,
        bits=bits,
        max_context=max_context,
        progress=lambda msg: print(f"{time.perf_counter() - started:7.1f}s {msg}", flush=True),
    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(json.dumps({"import_s": time.perf_counter() - started, "peak_rss_gb": peak, "size_gb": size / 1e9}))


def speed(path: Path, prompt_len: int, new: int, threads: int) -> None:
    from service.engine.base import SamplingParams
    from service.engine.onnx_engine import OnnxEngine

    started = time.perf_counter()
    engine = OnnxEngine(path, intra_op_threads=threads, prefix_cache_bytes=4 << 30)
    figures: dict[str, object] = {"load_s": time.perf_counter() - started, "threads": threads}
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(1000, 199_000, prompt_len)]

    def turn(key: str, ids: list[int]) -> tuple[list[int], dict[str, float]]:
        """Tokens, and wall and CPU seconds (all threads) of the prefill and of each decoded token."""
        engine.add_sequence(key, ids, SamplingParams(max_new_tokens=new + 1, temperature=0.0))
        wall, cpu = time.perf_counter(), time.process_time()
        tokens = [engine.step()[key].token_id]  # the first token comes at the end of the prefill
        spent = {"prefill_s": time.perf_counter() - wall, "prefill_cpu_s": time.process_time() - cpu}
        wall, cpu = time.perf_counter(), time.process_time()
        while engine.active_sequence_ids():
            tokens += [t.token_id for t in engine.step().values()]
        decoded = max(1, len(tokens) - 1)
        spent |= {"decode_s_per_token": (time.perf_counter() - wall) / decoded}
        spent |= {"decode_cpu_s_per_token": (time.process_time() - cpu) / decoded}
        return tokens, spent

    reply, spent = turn("first", prompt)
    figures |= {"prompt_tokens": prompt_len, **spent, "prefill_tok_s": prompt_len / spent["prefill_s"]}
    figures |= {"decode_tokens": len(reply) - 1, "decode_tok_s": 1 / spent["decode_s_per_token"]}
    figures["load_average"] = os.getloadavg()[0]
    print(json.dumps(figures), flush=True)
    second = prompt + reply + [int(t) for t in rng.integers(1000, 199_000, 32)]
    _, again = turn("second", second)
    figures |= {"second_turn_tokens": len(second), "second_turn_prefill_s": again["prefill_s"]}
    figures["prefix_cache"] = engine.prefix_cache is not None
    figures["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    print(json.dumps(figures), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write")
    w.add_argument("ckpt", type=Path)
    w.add_argument("--layers", type=int, default=24)
    i = sub.add_parser("import")
    i.add_argument("ckpt", type=Path)
    i.add_argument("out", type=Path)
    i.add_argument("--bits", type=int, default=4)
    i.add_argument("--max-context", type=int, default=None)
    s = sub.add_parser("speed")
    s.add_argument("model", type=Path)
    s.add_argument("--prompt", type=int, default=6000)
    s.add_argument("--new", type=int, default=16)
    s.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.command == "write":
        write_checkpoint(args.ckpt, args.layers)
    elif args.command == "import":
        import_checkpoint(args.ckpt, args.out, args.bits, args.max_context)
    else:
        speed(args.model, args.prompt, args.new, args.threads)


if __name__ == "__main__":
    main()
