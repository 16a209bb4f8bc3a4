"""`model ...` subcommands for the service CLI: build, quantize, import and inspect models (service/engine/ does
the work; this module only parses and reports, so the engine never imports the trainer it also offers)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from service.engine.config import (
    INT8_AUTO,
    INT8_BLOCK_NAMES,
    INT8_BLOCK_SIZE,
    INT8_PER_ROW,
    DecoderConfig,
    default_int8_block,
    int8_block_name,
    int8_block_or_default,
    int8_layout_label,
    parse_int8_block,
    read_config,
)
from service.engine.cpu import cpu_features
from service.engine.gptoss import GptOssSpec
from service.engine.shapes import GPTOSS_SHAPES, SHAPES, alternating_layers, shape_config

# Each command imports what writes or reads graphs (onnx, the builders) when it runs: every other
# command of the CLI, `serve` included, starts without them.


def add_model_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `model {build-default,quantize,import,info,build-random,build-scripted}` to a parent parser's
    subparsers."""
    model = subparsers.add_parser("model", help="build, quantize and inspect models")
    block_help = (
        "int8 weights' block size along K (contrib layout), or row: one scale per weight row and per activation "
        f"row (MatMulInteger: faster prefill and batched decode than blocks). Default {INT8_AUTO}: row, for the "
        "u8s8 QGEMM on a CPU with VNNI (such a model loads only where VNNI is) and u8u8 without (loads anywhere; "
        f"this CPU: {int8_layout_label(default_int8_block())}). Larger blocks decode faster and round more "
        "coarsely: see docs/performance/2026-12-04-int8-block-size.md"
    )
    block_choices = "{" + ",".join((*INT8_BLOCK_NAMES, INT8_AUTO)) + "}"
    sub = model.add_subparsers(dest="model_command", required=True)

    p = sub.add_parser("build-default", help="build (if needed) and cache the built-in model")
    p.add_argument("--cache-dir", type=Path, default=None)
    p.set_defaults(func=_build_default)

    p = sub.add_parser(
        "quantize", help="write an int8 copy of a model directory (with its tokenizer and configs) to a new directory"
    )
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path, help="a new directory (written elsewhere and renamed into place at the end)")
    p.add_argument(
        "--layout",
        choices=["contrib"],
        default=None,
        help="contrib: rewrite a standard-op fp32 graph (ours, a torch/Optimum export of a Llama, Mistral or "
        "Qwen2 model) in the contrib layout with MatMulNBits int8, which decodes batched, each row bit-identical "
        "to decoding alone. Default: keep SRC's layout (a standard-op graph gets dynamic int8 and steps one "
        "sequence at a time)",
    )
    p.add_argument("--block-size", type=_block_size, default=None, metavar=block_choices, help=block_help)
    p.set_defaults(func=_quantize)

    p = sub.add_parser(
        "import",
        help="import a Hugging Face safetensors checkpoint (llama, mistral, qwen2, qwen3, gpt_oss) as a servable "
        "ONNX model directory",
        description="Reads config.json and the *.safetensors weights of a checkpoint as downloaded from the Hugging "
        "Face Hub (tensor by tensor; no torch) and writes the contrib-layout graph the engine decodes batched, each "
        "row bit-identical to decoding it alone (gpt-oss: its MoE graph), with the tokenizer, chat template and "
        "generation config. SERVICE_MODEL=HF_DIR does the same once, into the model cache, at start.",
    )
    p.add_argument("src", type=Path, help="the checkpoint directory (config.json + *.safetensors)")
    p.add_argument("out", type=Path, help="a new directory (written elsewhere and renamed into place at the end)")
    bits = p.add_mutually_exclusive_group()
    bits.add_argument(
        "--bits",
        type=int,
        choices=[8, 4, 32],
        default=None,
        help="8: int8 weights (default; gpt-oss: 4, its experts' own precision); 4: int4 projections in blocks of "
        "16 or 32 (the head stays int8); 32: unquantized (a debug path: transformers' logits to float rounding)",
    )
    bits.add_argument("--fp32", dest="bits", action="store_const", const=32, help="the same as --bits 32")
    p.add_argument("--block-size", type=_block_size, default=None, metavar=block_choices, help=block_help)
    p.add_argument(
        "--max-context",
        type=int,
        default=None,
        help="the context served: prompt + output tokens (default: the checkpoint's, at most 32768; each "
        "generating run holds a KV cache this long)",
    )
    p.set_defaults(func=_import)

    p = sub.add_parser("info", help="print a model directory's description as JSON")
    p.add_argument("path", type=Path, nargs="?", default=None, help="default: the built-in model")
    p.set_defaults(func=_info)

    p = sub.add_parser(
        "build-random",
        help="build a random-weight model of a known shape, ready for SERVICE_MODEL",
        description="A seeded random-weight decoder of a known shape. By default it is on the Harmony vocabulary "
        "(201,088 ids, chat_format harmony), so SERVICE_MODEL=OUT serves it as it is. --vocab native keeps the "
        "original model's vocabulary size (for benchmarks; it has no tokenizer and cannot be served). "
        "gpt-oss shapes are always on the Harmony vocabulary.",
    )
    p.add_argument("out", type=Path, help="a new directory")
    p.add_argument("--shape", choices=sorted([*SHAPES, *GPTOSS_SHAPES]), default="tiny")
    p.add_argument("--vocab", choices=["harmony", "native"], default="harmony")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fp32", action="store_true", help="skip int8 quantization (not for gpt-oss shapes)")
    p.add_argument("--layers", type=int, default=None, help="gpt-oss shapes: fewer layers of the same width")
    p.add_argument("--expert-bits", type=int, choices=[4, 8], default=None, help="gpt-oss shapes (default 4)")
    p.add_argument("--block-size", type=_block_size, default=None, metavar=block_choices, help=block_help)
    p.set_defaults(func=_build_random)

    p = sub.add_parser(
        "build-scripted",
        help="build a scripted Harmony decoder (answers follow rules, not weights), ready for SERVICE_MODEL",
        description="A decoder whose next token follows a script chosen by what the prompt contains (for tests "
        "with real clients; see service/engine/scripted.py). Rules are tried in order; the first whose `when` "
        "texts all occur in the prompt gives the completion, in Harmony text.",
    )
    p.add_argument("out", type=Path, help="a new directory")
    p.add_argument(
        "--rules",
        default=None,
        help='JSON list of {"script": HARMONY_TEXT, "when": [TEXT, ...]}, or @FILE holding it, e.g. '
        '[{"when": ["Say hello"], "script": "<|channel|>final<|message|>Hello!<|return|>"}]',
    )
    p.add_argument("--script", action="append", default=[], help="a rule that always matches (after --rules)")
    p.add_argument("--max-context", type=int, default=32_768)
    p.add_argument("--model-id", default="scripted")
    p.set_defaults(func=_build_scripted)

    from service.training.cli import add_train_builtin  # torch is imported only when the command runs

    add_train_builtin(sub)


def _block_size(text: str) -> int | None:
    try:
        return parse_int8_block(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run_model_command(args: argparse.Namespace) -> int:
    return int(args.func(args) or 0)


def _build_default(args: argparse.Namespace) -> int:
    from service.engine.model_dir import describe_builtin, ensure_builtin_model

    path = ensure_builtin_model(args.cache_dir, progress=True)
    print(json.dumps({"path": str(path), **describe_builtin()}, indent=2))
    return 0


def _quantize(args: argparse.Namespace) -> int:
    from service.engine.convert import AlreadyContrib, convert_to_contrib
    from service.engine.quantize import quantize_model

    block = args.block_size
    try:
        if args.layout == "contrib":
            out = convert_to_contrib(args.src, args.dst, block=int8_block_or_default(block))
        else:
            out = quantize_model(args.src, args.dst, block=block)
    except AlreadyContrib:  # a contrib source: --layout contrib is what quantizing it gives anyway
        out = quantize_model(args.src, args.dst, block=block)
    scheme = read_config(out).extra["quantization"]["scheme"]
    print(f"{out}: int8 ({scheme}); files: {', '.join(sorted(p.name for p in out.iterdir()))}")
    return 0


def _import(args: argparse.Namespace) -> int:
    from service.engine.importers import import_checkpoint

    started = time.monotonic()
    out = import_checkpoint(
        args.src,
        args.out,
        bits=args.bits,
        block=args.block_size,
        max_context=args.max_context,
        progress=print,
        bar=True,
    )
    meta = read_config(out)
    scheme = (meta.extra.get("quantization") or {}).get("scheme", "fp32")
    print(f"{out} ({scheme}, {time.monotonic() - started:.1f}s; serve it with SERVICE_MODEL={out})")
    return 0


def _info(args: argparse.Namespace) -> int:
    from service.engine.info import model_info
    from service.engine.model_dir import ensure_builtin_model

    path = args.path or ensure_builtin_model(progress=True)
    print(json.dumps(model_info(path), indent=2))
    return 0


def _build_random(args: argparse.Namespace) -> int:
    from service.engine.builder import build_random_decoder
    from service.engine.model_files import ModelDirError, new_directory

    started = time.monotonic()
    if args.block_size is not None and (args.shape in GPTOSS_SHAPES or args.fp32):
        raise ModelDirError("--block-size is for int8 dense shapes (not --fp32, not gpt-oss shapes)")
    if args.shape in GPTOSS_SHAPES:
        out = _build_random_gptoss(args)
        print(f"{out} ({time.monotonic() - started:.1f}s; serve it with SERVICE_MODEL={out})")
        return 0
    extra = {"model_id": f"random-{args.shape}"}
    if args.vocab == "harmony":
        extra["chat_format"] = "harmony"
    # (--fp32 builds no int8 weights: its block is unused)
    block = INT8_BLOCK_SIZE if args.fp32 else int8_block_or_default(args.block_size)
    with new_directory(args.out) as tmp:
        config = shape_config(args.shape, args.vocab)
        build_random_decoder(tmp, config, args.seed, quantize=not args.fp32, extra=extra, progress=print, block=block)
    if args.vocab == "harmony":
        note = f"serve it with SERVICE_MODEL={args.out}"
    else:
        note = "native vocabulary and no tokenizer: for benchmarks, not servable"
    layout = "fp32" if args.fp32 else _int8_layout(block, chosen=args.block_size is None)
    print(f"{args.out} ({layout}; {time.monotonic() - started:.1f}s; {note})")
    return 0


def _int8_layout(block: int, *, chosen: bool) -> str:
    """How a build's int8 layout is reported: its block (per row: and its QGEMM), and whether it was picked for
    this CPU."""
    what = f"int8 block {int8_block_name(block)}"
    if block == INT8_PER_ROW:
        what += f", {cpu_features().row_int8_qgemm} QGEMM"
    return what + (f" ({INT8_AUTO}: chosen for this CPU)" if chosen else "")


def _build_scripted(args: argparse.Namespace) -> int:
    from service.engine.scripted import Rule, parse_rules, write_scripted_model

    text = args.rules
    if text is not None and text.startswith("@"):
        text = Path(text[1:]).read_text()
    rules = (parse_rules(text) if text is not None else []) + [Rule(s) for s in args.script]
    if not rules:
        raise SystemExit("build-scripted: give --rules or --script")
    out = write_scripted_model(args.out, rules, max_context=args.max_context, model_id=args.model_id)
    print(f"{out} ({len(rules)} rules; serve it with SERVICE_MODEL={out})")
    return 0


def _build_random_gptoss(args: argparse.Namespace) -> Path:
    """Random weights, experts drawn directly as int4/int8 codes (a real-shape model never exists in fp32)."""
    from service.engine.gptoss import random_gptoss_weights
    from service.engine.graph_gptoss import write_gptoss_model

    config, spec = GPTOSS_SHAPES[args.shape]
    layers = args.layers or config.num_layers
    config = DecoderConfig(**{**config.to_dict(), "num_layers": layers})
    layer_types = alternating_layers(layers)
    spec = GptOssSpec(**{**spec.__dict__, "layer_types": layer_types, "expert_bits": args.expert_bits or 4})
    print("weights + graph")
    weights = random_gptoss_weights(config, spec, args.seed, expert_codes=True)
    extra = {"model_id": f"random-{args.shape}", "chat_format": "harmony", "seed": args.seed}
    return write_gptoss_model(args.out, config, spec, weights, quantize_dense=True, extra=extra)
