"""Trained weights -> the shipped artifact (compact .npz + manifest JSON) -> a servable ONNX int8 directory."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from service.engine.compact import CompactModel, save_compact
from service.engine.model_dir import BUILTIN_NAME, HARMONY_VOCAB_SIZE, materialise_builtin
from service.training.train import TrainedModel


def write_artifact(model: TrainedModel, out_dir: Path, name: str = BUILTIN_NAME) -> Path:
    """`out_dir/NAME.npz` and `out_dir/NAME.json` (the manifest: hash, shape, training config, metrics)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    artifact = out_dir / f"{name}.npz"
    sha = save_compact(artifact, CompactModel(model.weights, model.vocab_ids, model.target_ids))
    full = replace(model.decoder, vocab_size=HARMONY_VOCAB_SIZE)
    manifest: dict[str, Any] = {
        "model_id": name,
        "artifact": artifact.name,
        "sha256": sha,
        "size_bytes": artifact.stat().st_size,
        "decoder": full.to_dict(),
        "parameters_trained": int(sum(w.size for w in model.weights.values())),
        "compact_vocab": {"input_ids": int(model.vocab_ids.size), "writable_ids": int(model.target_ids.size)},
        "training": asdict(model.config),
        "metrics": {"training": model.metrics},
    }
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return path


def export(model: TrainedModel, out_dir: Path) -> tuple[Path, Path]:
    """The artifact in `out_dir`, and its servable ONNX int8 directory in `out_dir/onnx-int8`."""
    manifest = write_artifact(model, out_dir)
    onnx_dir = materialise_builtin(manifest, out_dir / "onnx-int8")
    return manifest, onnx_dir
