"""Prompt/output formats: pick the ChatFormat a model directory needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from service.prompting.base import ChatFormat

__all__ = ["chat_format_for"]


def chat_format_for(model_dir: Path, config: dict[str, Any]) -> ChatFormat:
    """config is the model's config.json: chat_format "harmony" -> HarmonyFormat (optional keys
    harmony_model_identity, harmony_knowledge_cutoff, harmony_conversation_start_date); anything
    else -> the tokenizer's chat template from model_dir."""
    model_dir = Path(model_dir)
    fmt = config.get("chat_format")
    if fmt == "harmony":
        from service.prompting.harmony import HarmonyFormat

        return HarmonyFormat(
            model_identity=config.get("harmony_model_identity"),
            knowledge_cutoff=config.get("harmony_knowledge_cutoff"),
            conversation_start_date=config.get("harmony_conversation_start_date"),
        )
    if fmt not in (None, "chat_template"):
        raise ValueError(f"unknown chat_format {fmt!r} for {model_dir} (expected 'harmony' or 'chat_template')")
    from service.prompting.chat_template import TOKENIZER_FILES, ChatTemplateFormat

    if not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(
            f"{model_dir} has no tokenizer ({', '.join(TOKENIZER_FILES)}) and config.json does not say "
            'chat_format "harmony": cannot build a prompt format for this model'
        )
    eos = config.get("eos_token_id")
    extra = eos if isinstance(eos, list) else ([eos] if eos is not None else [])
    return ChatTemplateFormat(model_dir, extra_stop_ids=extra)
