"""Decoder shape and metadata: our config.json, HF-style config.json from user-brought exports, and
onnxruntime-genai's genai_config.json (a directory its model builder wrote, with no config.json)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from service.engine.cpu import CpuFeatures, cpu_features
from service.engine.model_files import ModelDirError

CONFIG_FILE = "config.json"
GENAI_CONFIG_FILE = "genai_config.json"
# The Harmony vocabulary (o200k_harmony): its size and the ids a Harmony model starts and ends with.
HARMONY_VOCAB_SIZE = 201_088
HARMONY_BOS_ID = 199_998  # <|startoftext|>
HARMONY_EOS_ID = 200_002  # <|return|>

# int8 weights' block along K, as onnxruntime-genai's builder and llama.cpp's Q8_0: 32. The sizes MatMulNBits
# accepts (a power of two, at least 16). accuracy_level 4 also quantizes the activations in blocks of this size,
# so larger blocks run faster (fewer scales per dot product) but round more coarsely around an outlier
# activation: a build option measured in docs/performance/2026-12-04-int8-block-size.md.
INT8_BLOCK_SIZE = 32
# Block "row" (0 here): one scale per weight row (output channel) and one per activation row, multiplied by
# MatMulInteger (MLAS's QGEMM, exact int32 sums) instead of MatMulNBits: a row's result is the same bits at any
# batch and in any run length, and on a CPU with VNNI the QGEMM kernels run prefill and batched decode faster
# (docs/performance/2026-12-04-per-row-int8.md).
INT8_PER_ROW = 0
INT8_BLOCK_SIZES = (INT8_PER_ROW, 16, 32, 64, 128, 256)
# What `--block-size auto` (the default of build-random, quantize and import) picks: default_int8_block().
INT8_AUTO = "auto"


def int8_block_name(block: int) -> str:
    """How the CLI and config.json spell a block size: "row" or the number."""
    return "row" if block == INT8_PER_ROW else str(block)


INT8_BLOCK_NAMES = tuple(map(int8_block_name, INT8_BLOCK_SIZES))  # the CLI's choices, in order


def default_int8_block() -> int:
    """The int8 layout written when none is named: per row on every CPU, for the QGEMM chosen for the CPU that
    builds the model (CpuFeatures.row_int8_qgemm: u8s8 with VNNI, u8u8 without). Faster than blocks of 32 in
    prefill and batched decode with VNNI and without (docs/performance/2026-12-06-auto-int8-layout.md and
    2026-12-07-per-row-int8-avx2.md). A u8u8 model loads on any CPU; a u8s8 one is refused, in one line saying
    what to rebuild, on a CPU without VNNI (onnx_engine.check_int8_kernels)."""
    return INT8_PER_ROW


def int8_layout_label(block: int, features: CpuFeatures | None = None) -> str:
    """A name for the int8 layout a build on this CPU writes for `block`: its block, and for per-row int8 the
    QGEMM flavour when it is u8u8 (the u8s8 build, made with VNNI, is plain "row": cache names stay as before)."""
    if block != INT8_PER_ROW:
        return int8_block_name(block)
    return "row" if (features or cpu_features()).row_int8_qgemm == "u8s8" else "row-u8u8"


def int8_block_or_default(block: int | None) -> int:
    """The block asked for, or (None: `--block-size auto`, nothing named) the one chosen for this CPU."""
    return default_int8_block() if block is None else block


def parse_int8_block(text: str) -> int | None:
    """The CLI's --block-size: "row", one of the MatMulNBits sizes, or "auto" (None: default_int8_block)."""
    if text == INT8_AUTO:
        return None
    block = INT8_PER_ROW if text == "row" else int(text) if text.isdigit() else -1
    if block not in INT8_BLOCK_SIZES:
        raise ValueError(f"int8 block size must be one of {', '.join(INT8_BLOCK_NAMES)} or {INT8_AUTO}")
    return block


# The RoPE scalings weights.rope_tables computes.
ROPE_SCALINGS = ("llama3",)


@dataclass(frozen=True)
class DecoderConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # 0 where the directory does not say (genai_config.json); only building needs it
    max_position: int  # the context: prompt + generated tokens
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    # RoPE frequency scaling, as Hugging Face's rope_scaling / rope_parameters spell it; only
    # {"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}
    # (Llama 3.1+). None: plain RoPE. Named apart from HF's keys: read_config keeps those in the metadata.
    rope_scale: dict[str, Any] | None = field(default=None, hash=False)
    # Sliding-window attention (Mistral v0.1): a position attends to the last `attention_window` positions, itself
    # included (GroupQueryAttention's local_window_size over the full KV cache). 0: every earlier position.
    attention_window: int = 0

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even (RoPE)")
        if self.rope_scale is not None and self.rope_scale.get("rope_type") not in ROPE_SCALINGS:
            kind = self.rope_scale.get("rope_type")
            raise ValueError(f"RoPE scaling {kind!r} (supported: {', '.join(ROPE_SCALINGS)})")

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

    @property
    def stop_token_ids(self) -> list[int]:
        """Every end-of-sequence id the model declares (HF and genai configs may list several)."""
        listed = self.extra.get("eos_token_ids")
        if listed:
            return [int(t) for t in listed]
        return [] if self.decoder.eos_token_id is None else [self.decoder.eos_token_id]

    def as_dict(self) -> dict[str, Any]:
        """Shape and metadata as one flat dict (what config.json holds)."""
        return {**self.decoder.to_dict(), **self.extra}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, sort_keys=True) + "\n"


def read_config(model_dir: Path) -> ModelMeta:
    """config.json (ours or HF's); else genai_config.json. Where both exist config.json describes the
    model and genai_config.json adds what only it says (KV buffer sharing, graph input/output names)."""
    config_path, genai_path = model_dir / CONFIG_FILE, model_dir / GENAI_CONFIG_FILE
    genai = _load_json(genai_path) if genai_path.is_file() else None
    if config_path.is_file():
        raw = _load_json(config_path)
        try:
            dec = DecoderConfig.from_dict(raw)
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelDirError(f"{config_path} does not describe a decoder: {exc!r}") from exc
        dec_keys = set(dec.to_dict())
        extra = {k: v for k, v in raw.items() if k not in dec_keys}
        if isinstance(raw.get("eos_token_id"), list):
            extra["eos_token_ids"] = raw["eos_token_id"]
        if genai is not None:
            extra = {**_genai_meta(genai_path, genai).extra, **extra}
        return ModelMeta(dec, extra)
    if genai is not None:
        return _genai_meta(genai_path, genai)
    if not model_dir.is_dir():
        raise ModelDirError(f"{model_dir} is not a directory")
    raise ModelDirError(f"{model_dir} is not a model directory: no {CONFIG_FILE} or {GENAI_CONFIG_FILE} in it")


def _load_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelDirError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelDirError(f"{path} is not a JSON object")
    return data


def _genai_meta(path: Path, genai: dict[str, Any]) -> ModelMeta:
    """What onnxruntime-genai's genai_config.json says about the decoder (see its config reference:
    model.{context_length, vocab_size, bos/eos_token_id}, model.decoder.{head_size, hidden_size,
    num_*}, .inputs/.outputs name templates, search.past_present_share_buffer)."""
    try:
        model = genai["model"]
        decoder = model["decoder"]
        heads = int(decoder["num_attention_heads"])
        eos = model.get("eos_token_id")
        eos_ids = [int(t) for t in eos] if isinstance(eos, list) else ([int(eos)] if eos is not None else [])
        search = genai.get("search", {})
        dec = DecoderConfig(
            vocab_size=int(model["vocab_size"]),
            hidden_size=int(decoder["hidden_size"]),
            num_layers=int(decoder["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(decoder.get("num_key_value_heads", heads)),
            head_dim=int(decoder["head_size"]),
            intermediate_size=0,
            max_position=int(model.get("context_length") or search["max_length"]),
            bos_token_id=model.get("bos_token_id"),
            eos_token_id=eos_ids[0] if eos_ids else None,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelDirError(f"{path} does not describe a decoder: missing or bad {exc}") from exc
    names = {**decoder.get("inputs", {}), **decoder.get("outputs", {})}
    extra: dict[str, Any] = {
        "format": "onnxruntime-genai",
        "graph": "genai",
        "eos_token_ids": eos_ids,
        "io_names": {k: v for k, v in names.items() if isinstance(v, str)},
    }
    if search.get("past_present_share_buffer"):
        extra["kv_cache"] = "shared_buffer"
    if model.get("type"):
        extra["model_type"] = model["type"]
    return ModelMeta(dec, extra)


def write_config(model_dir: Path, meta: ModelMeta) -> None:
    (model_dir / CONFIG_FILE).write_text(meta.to_json())
