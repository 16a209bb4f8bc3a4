"""Loading the model the server runs: a directory the user names, or the built-in test model."""

from __future__ import annotations

import json
from pathlib import Path

from service.config import Settings
from service.engine.info import model_info
from service.engine.model_dir import ensure_builtin_model
from service.engine.onnx_engine import OnnxEngine
from service.model_runtime import ModelRuntime
from service.prompting import chat_format_for


def resolve_model_dir(settings: Settings) -> Path:
    if settings.model is not None:
        if not (settings.model / "config.json").is_file():
            raise FileNotFoundError(f"SERVICE_MODEL={settings.model} is not a model directory (no config.json)")
        return settings.model
    return ensure_builtin_model(settings.model_cache, progress=True)


def load_runtime(settings: Settings) -> ModelRuntime:
    model_dir = resolve_model_dir(settings)
    config = json.loads((model_dir / "config.json").read_text())
    engine = OnnxEngine(model_dir, intra_op_threads=settings.intra_op_threads)
    chat_format = chat_format_for(model_dir, config)
    info = model_info(model_dir)
    return ModelRuntime(model_id=engine.model_id, engine=engine, chat_format=chat_format, info=info)
