"""Hugging Face safetensors checkpoints in, servable ONNX model directories out (`model import`, and
`SERVICE_MODEL=HF_DIR` through the model cache). No torch: the safetensors files are read tensor by tensor with
their numpy API (importers/checkpoint.py).

Readers and writers apart: one module per family turns a Checkpoint into the writer's input (llama.py: llama,
mistral; qwen.py: qwen2, qwen3; gpt_oss.py: gpt-oss's MXFP4 experts); graph_contrib (dense) and graph_gptoss
stay the writers. Every other architecture is refused in one line."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from service.engine.config import CONFIG_FILE, INT8_BLOCK_SIZE, default_int8_block, int8_block_name
from service.engine.importers.checkpoint import Checkpoint
from service.engine.importers.dense import DenseModel, UnsupportedCheckpoint, write_dense
from service.engine.importers.llama import MODEL_TYPES as LLAMA_TYPES
from service.engine.importers.llama import read_llama
from service.engine.importers.qwen import MODEL_TYPES as QWEN_TYPES
from service.engine.importers.qwen import read_qwen
from service.engine.model_dir import is_checkpoint_dir
from service.engine.model_files import ModelDirError, copy_support_files, new_directory

Progress = Callable[[str], None]
DenseReader = Callable[..., DenseModel]

DENSE_FAMILIES: dict[str, DenseReader] = {
    **dict.fromkeys(LLAMA_TYPES, read_llama),
    **dict.fromkeys(QWEN_TYPES, read_qwen),
}
GPT_OSS = "gpt_oss"
SUPPORTED_MODEL_TYPES = (*DENSE_FAMILIES, GPT_OSS)
BITS = (4, 8, 32)  # 32: the unquantized graph (a debug path: the exact reference)
DEFAULT_BITS = {GPT_OSS: 4}  # gpt-oss's experts are 4-bit in the checkpoint; dense families default to 8
# What a checkpoint directory holds that does not travel with the imported model: weights of every format
# (Meta's `original/` folder of .pth files included), their index, the source config.json (rewritten).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt", ".gguf", ".h5", ".msgpack", ".ckpt", ".onnx", ".onnx.data")

__all__ = [
    "BITS",
    "SUPPORTED_MODEL_TYPES",
    "Checkpoint",
    "UnsupportedCheckpoint",
    "checkpoint_model_id",
    "default_bits",
    "import_checkpoint",
    "is_checkpoint_dir",
]


def default_bits(model_type: str) -> int:
    return DEFAULT_BITS.get(model_type, 8)


def import_checkpoint(
    src: Path,
    out: Path,
    *,
    bits: int | None = None,
    block: int | None = None,
    max_context: int | None = None,
    progress: Progress | None = None,
    bar: bool = False,
    hash_memo: Path | None = None,
) -> Path:
    """Import the checkpoint in `src` into the new directory `out` (written beside it and renamed into place):
    graph, config.json (with a `source` block: architecture, parameters, dtypes, hashes) and the tokenizer, chat
    template and generation config. `bits`: 8 (int8, the default for dense families), 4 (int4 projections), 32
    (unquantized); `block`: the quantized weights' block size along K (int8 also INT8_PER_ROW, "row"; default:
    default_int8_block() for int8, 32 for int4); `max_context`: the served context (default: the checkpoint's, at
    most dense.DEFAULT_MAX_CONTEXT). `progress` hears each step; `bar` draws a progress bar over the tensors read.
    ModelDirError (one line) says what does not fit."""
    src, out = Path(src), Path(out)
    note = progress or (lambda _msg: None)
    with Checkpoint(src) as ckpt:
        kind = ckpt.model_type
        bits = default_bits(kind) if bits is None else bits
        if bits not in BITS:
            raise ModelDirError(f"--bits must be one of {', '.join(map(str, BITS))}, not {bits}")
        if kind == GPT_OSS:
            return _import_gpt_oss(
                ckpt, out, bits=bits, block=block, max_context=max_context, note=note, memo=hash_memo
            )
        reader = DENSE_FAMILIES.get(kind)
        if reader is None:
            supported = ", ".join(SUPPORTED_MODEL_TYPES)
            raise UnsupportedCheckpoint(
                f"{src}: model_type {kind!r} ({ckpt.architecture}) cannot be imported (supported: {supported})"
            )
        block = _check_block(bits, block)
        try:
            model = reader(ckpt, max_context=max_context)
        except UnsupportedCheckpoint as exc:
            raise UnsupportedCheckpoint(f"{src} ({ckpt.architecture}) cannot be imported: {exc}") from None
        note("hashing the checkpoint")
        source = _source(ckpt, hash_memo)
        extra = {"model_id": checkpoint_model_id(src), "source": source}
        label = "fp32" if bits == 32 else f"int{bits}, block {int8_block_name(block)}"
        note(f"{ckpt.architecture}: {model.config.num_layers} layers, {source['parameters']:,} parameters -> {label}")
        with new_directory(out) as tmp, _tensor_bar(model, enabled=bar):
            write_dense(tmp, model, bits=bits, block=block, extra=extra)
            copy_support_files(src, tmp, skip=_not_carried(src))
    return out


def checkpoint_model_id(src: Path) -> str:
    """The model's name: `org/name` for a snapshot in the Hugging Face cache (models--org--name/snapshots/SHA),
    else the directory's name."""
    src = src.resolve()
    repo = src.parent.parent.name if src.parent.name == "snapshots" else ""
    if repo.startswith("models--"):
        return repo.removeprefix("models--").replace("--", "/")
    return src.name


def _check_block(bits: int, block: int | None) -> int:
    from service.engine.graph_contrib import check_block_size, check_int4_block_size

    if bits == 32:
        if block is not None:
            raise ModelDirError("--block-size is for quantized imports (--bits 8 or 4), not --bits 32")
        return INT8_BLOCK_SIZE
    if block is None:  # int8: the layout chosen for this CPU; int4: MatMulNBits blocks of 32
        block = default_int8_block() if bits == 8 else INT8_BLOCK_SIZE
    try:
        return check_int4_block_size(block) if bits == 4 else check_block_size(block)
    except ValueError as exc:
        raise ModelDirError(str(exc)) from None


def _source(ckpt: Checkpoint, memo: Path | None) -> dict[str, Any]:
    files = ckpt.file_hashes(memo)
    return {**ckpt.describe(ckpt.content_hash(memo), files), "context": ckpt.config.get("max_position_embeddings")}


def _not_carried(src: Path) -> set[str]:
    """Names in `src` that stay behind: weights, folders (Meta's `original/`), the source config.json."""
    skip = {CONFIG_FILE}
    for path in src.iterdir():
        if path.is_dir() or path.name.endswith(_WEIGHT_SUFFIXES) or path.name.endswith(".index.json"):
            skip.add(path.name)
    return skip


@contextlib.contextmanager
def _tensor_bar(model: DenseModel, *, enabled: bool) -> Iterator[None]:
    """A tqdm bar over the tensors the writer reads (each layer's weights are read, quantized and dropped)."""
    if not enabled:
        yield
        return
    from tqdm import tqdm

    seen: set[str] = set()  # a tied embedding is read twice (the Gather's table and the head)
    with tqdm(total=len(model.weights), desc="importing", unit="tensor") as bar:

        def read(name: str) -> None:
            if name not in seen:
                seen.add(name)
                bar.update(1)

        model.weights.on_read = read
        try:
            yield
        finally:
            model.weights.on_read = lambda _name: None


def _import_gpt_oss(
    ckpt: Checkpoint,
    out: Path,
    *,
    bits: int,
    block: int | None,
    max_context: int | None,
    note: Progress,
    memo: Path | None,
) -> Path:
    """gpt-oss's original MXFP4 checkpoint, through importers/gpt_oss.py (its own writer, graph_gptoss); the
    `source` block is added to what it writes."""
    if block is not None or max_context is not None:
        raise ModelDirError("--block-size and --max-context are for dense checkpoints, not gpt-oss")
    from service.engine.importers.gpt_oss import import_gpt_oss  # the MoE writer: only when needed

    note("hashing the checkpoint")
    source = _source(ckpt, memo)
    path = import_gpt_oss(ckpt.path, out, bits=bits, progress=note)
    record_source(path, source, model_id=checkpoint_model_id(ckpt.path))
    return path


def record_source(model_dir: Path, source: dict[str, Any], *, model_id: str) -> None:
    """Add `source` (and a model_id, where none is set) to a written model's config.json, atomically."""
    path = model_dir / CONFIG_FILE
    config = json.loads(path.read_text())
    config.setdefault("source", source)
    config.setdefault("model_id", model_id)
    tmp = path.with_name(f".{CONFIG_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
