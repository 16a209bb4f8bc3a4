"""Loading the model the server runs: a directory the user names, or the built-in test model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from service.config import Settings
from service.engine.config import read_config
from service.engine.model_dir import ensure_builtin_model, ensure_imported_model, is_checkpoint_dir
from service.engine.model_files import ModelDirError
from service.engine.onnx_engine import OnnxEngine
from service.model_runtime import ModelRuntime
from service.prompting import chat_format_for


def resolve_model_dir(settings: Settings) -> Path:
    if settings.model is not None:
        try:
            if is_checkpoint_dir(settings.model):  # a Hugging Face checkpoint: imported once into the cache
                return ensure_imported_model(settings.model, settings.model_cache, progress=True)
            read_config(settings.model)
        except ModelDirError as exc:
            raise ModelDirError(f"SERVICE_MODEL={settings.model}: {exc}") from exc
        return settings.model
    return ensure_builtin_model(settings.model_cache, progress=True)


def load_runtime(settings: Settings) -> ModelRuntime:
    """The engine, chat format and description of the configured model; ModelDirError (one line) when
    the directory cannot be served."""
    model_dir = resolve_model_dir(settings)
    try:
        meta = read_config(model_dir)
        engine = OnnxEngine(
            model_dir,
            intra_op_threads=settings.intra_op_threads,
            prefix_cache_bytes=settings.prefix_cache_bytes,
            prefill_tokens=settings.prefill_chunk_tokens,
            prefill_stall_ratio=settings.prefill_stall_ratio,
            mask_deadline_s=settings.mask_deadline_seconds,
        )
        chat_format = chat_format_for(model_dir, {**meta.as_dict(), "eos_token_id": meta.stop_token_ids})
    except Exception as exc:  # noqa: BLE001 - the loading boundary: whatever the files got wrong, say it in a line
        source = f"SERVICE_MODEL={model_dir}" if settings.model is not None else f"the built-in model {model_dir}"
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise ModelDirError(f"{source} cannot be loaded: {reason}") from exc
    return ModelRuntime(
        model_id=engine.model_id, engine=engine, chat_format=chat_format, describe_model=lambda: _describe(model_dir)
    )


def _describe(model_dir: Path) -> dict[str, Any]:
    from service.engine.info import model_info  # imports onnx (half a second): only when asked

    return model_info(model_dir)
