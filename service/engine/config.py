"""Decoder shape and metadata: our config.json, and HF-style config.json from user-brought exports."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class DecoderConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position: int  # the context: prompt + generated tokens
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even (RoPE)")

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    def parameter_count(self) -> int:
        h, d = self.hidden_size, self.head_dim
        attn = h * d * (self.num_heads * 2 + self.num_kv_heads * 2)
        mlp = 3 * h * self.intermediate_size
        per_layer = attn + mlp + 2 * h
        emb = self.vocab_size * h * (1 if self.tie_embeddings else 2)
        return emb + self.num_layers * per_layer + h

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DecoderConfig:
        """Ours, or HF-style (num_hidden_layers, num_attention_heads, max_position_embeddings, ...)."""
        if "num_layers" in d:
            names = {f.name for f in fields(cls)}
            return cls(**{k: v for k, v in d.items() if k in names})
        heads = int(d["num_attention_heads"])
        hidden = int(d["hidden_size"])
        eos = d.get("eos_token_id")
        if isinstance(eos, list):  # HF allows several; the first is the canonical one
            eos = eos[0] if eos else None
        return cls(
            vocab_size=int(d["vocab_size"]),
            hidden_size=hidden,
            num_layers=int(d["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(d.get("num_key_value_heads", heads)),
            head_dim=int(d.get("head_dim") or hidden // heads),
            intermediate_size=int(d["intermediate_size"]),
            max_position=int(d.get("max_position_embeddings", 2048)),
            rope_theta=float(d.get("rope_theta") or (d.get("rope_parameters") or {}).get("rope_theta") or 10000.0),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(d.get("tie_word_embeddings", False)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=eos,
        )


@dataclass
class ModelMeta:
    """config.json as a whole: the decoder shape plus service metadata (model_id, chat_format, ...)."""

    decoder: DecoderConfig
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def model_id(self) -> str | None:
        return self.extra.get("model_id")

    def to_json(self) -> str:
        return json.dumps({**self.decoder.to_dict(), **self.extra}, indent=2, sort_keys=True) + "\n"


GENAI_CONFIG_FILE = "genai_config.json"


def _from_genai(genai: dict[str, Any]) -> dict[str, Any]:
    """An onnxruntime-genai export without config.json: its genai_config.json, in HF-style keys."""
    model = genai["model"]
    dec = model["decoder"]
    return {
        "vocab_size": model["vocab_size"],
        "hidden_size": dec["hidden_size"],
        "num_hidden_layers": dec["num_hidden_layers"],
        "num_attention_heads": dec["num_attention_heads"],
        "num_key_value_heads": dec["num_key_value_heads"],
        "head_dim": dec["head_size"],
        "intermediate_size": 0,  # not recorded by the builder; the engine does not need it
        "max_position_embeddings": model["context_length"],
        "bos_token_id": model.get("bos_token_id"),
        "eos_token_id": model.get("eos_token_id"),
        "graph": "onnxruntime-genai",
        "model_type": model.get("type"),
    }


def read_config(model_dir: Path) -> ModelMeta:
    path = model_dir / CONFIG_FILE
    if not path.exists() and (model_dir / GENAI_CONFIG_FILE).exists():
        raw = _from_genai(json.loads((model_dir / GENAI_CONFIG_FILE).read_text()))
    else:
        raw = json.loads(path.read_text())
    dec = DecoderConfig.from_dict(raw)
    dec_keys = set(dec.to_dict())
    return ModelMeta(dec, {k: v for k, v in raw.items() if k not in dec_keys})


def write_config(model_dir: Path, meta: ModelMeta) -> None:
    (model_dir / CONFIG_FILE).write_text(meta.to_json())
