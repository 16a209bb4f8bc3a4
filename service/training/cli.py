"""`model train-builtin OUT`: train, export and check the built-in model (needs the `train` extra: torch)."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import fields
from pathlib import Path

_OPTIONS = (
    "seed", "samples", "steps", "batch_size", "lr", "hidden_size", "num_layers", "head_dim", "intermediate_size",
    "threads", "copy_weight", "drills", "repeats", "tie_embeddings", "induction_steps",
    "induction_every", "induction_lists", "attention_window", "max_position", "writable_ids", "agentic_share",
)  # fmt: skip


def add_train_builtin(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from service.training.config import DEFAULT_TRAIN_CONFIG

    p = subparsers.add_parser(
        "train-builtin",
        help="train the built-in model on the synthetic Harmony corpus (needs torch: pip install '.[train]')",
        description="Writes OUT/builtin-harmony-tiny.{npz,json} (the artifact to ship in service/builtin_model/) "
        "and OUT/onnx-int8 (servable with SERVICE_MODEL).",
    )
    p.add_argument("out", type=Path)
    defaults = {f.name: getattr(DEFAULT_TRAIN_CONFIG, f.name) for f in fields(DEFAULT_TRAIN_CONFIG)}
    for name in _OPTIONS:
        value = defaults[name]
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=value, help=f"default {value}")
        else:
            p.add_argument(flag, type=type(value), default=value, help=f"default {value}")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_train_builtin)


def _train_builtin(args: argparse.Namespace) -> int:
    try:
        from service.training.export import export
        from service.training.train import train
    except ImportError as exc:
        print(f"train-builtin needs torch (pip install '.[train]'): {exc}")
        return 1
    from dataclasses import replace

    from service.training.config import DEFAULT_TRAIN_CONFIG

    cfg = replace(DEFAULT_TRAIN_CONFIG, **{name: getattr(args, name) for name in _OPTIONS})
    started = time.monotonic()
    model = train(cfg, progress=not args.no_progress)
    manifest, onnx_dir = export(model, args.out)
    print(json.dumps(json.loads(manifest.read_text())["metrics"], indent=2))
    print(f"wrote {manifest} and {onnx_dir} in {time.monotonic() - started:.0f}s")
    return 0
