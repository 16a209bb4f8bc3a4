"""The files of a model directory: which one is the graph, writing it, and what else travels with it."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx  # imported where a graph is read or written: `import onnx` costs about a second at start-up

MODEL_FILE = "model.onnx"
EXTERNAL_DATA_THRESHOLD = 1 << 30  # protobuf caps a single file at 2 GiB; go external well before that
_KNOWN_MODEL_FILES = (MODEL_FILE, "decoder_model_merged.onnx", "decoder_with_past_model.onnx", "model_quantized.onnx")
# Ops that hold int8 (or narrower) weights: a graph with any of them is quantized already.
QUANTIZED_OPS = frozenset(
    {"MatMulInteger", "DynamicQuantizeMatMul", "MatMulNBits", "MatMulIntegerToFloat", "QLinearMatMul", "QGemm"}
)


class ModelDirError(ValueError):
    """A path that is not a usable model directory; the message says what is missing, in one line."""


def find_model_file(model_dir: Path) -> Path:
    """The decoder graph of a model directory."""
    if not model_dir.is_dir():
        raise ModelDirError(f"{model_dir} is not a directory")
    for name in _KNOWN_MODEL_FILES:
        if (model_dir / name).is_file():
            return model_dir / name
    found = sorted(model_dir.glob("*.onnx"))
    if not found:
        raise ModelDirError(f"{model_dir} is not a model directory: no .onnx file in it")
    return found[0]


def save_model(model: onnx.ModelProto, path: Path) -> None:
    """Write model.onnx, with weights in model.onnx.data when the model is large."""
    import onnx

    size = sum(len(t.raw_data) for t in model.graph.initializer)
    if size > EXTERNAL_DATA_THRESHOLD:
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=path.name + ".data",
            size_threshold=1024,
        )
    else:
        onnx.save_model(model, str(path))


def graph_files(model_dir: Path) -> set[str]:
    """Every .onnx file of the directory and the external-data files its graphs point to."""
    import onnx

    names: set[str] = set()
    for path in model_dir.glob("*.onnx"):
        names.add(path.name)
        model = onnx.load(str(path), load_external_data=False)
        for tensor in model.graph.initializer:
            for entry in tensor.external_data:
                if entry.key == "location":
                    names.add(entry.value)
    return names


def copy_support_files(src_dir: Path, dst_dir: Path, *, skip: set[str]) -> list[str]:
    """Copy what a model needs besides its graph (tokenizer, chat template, generation and genai
    configs, ...): every file and folder of `src_dir` not named in `skip`. Returns the names copied."""
    copied = []
    for path in sorted(src_dir.iterdir()):
        if path.name in skip or path.name.startswith("."):
            continue
        if path.is_dir():
            shutil.copytree(path, dst_dir / path.name)
        else:
            shutil.copy2(path, dst_dir / path.name)
        copied.append(path.name)
    return copied


@contextlib.contextmanager
def new_directory(dst: Path) -> Iterator[Path]:
    """A hidden sibling directory to fill, renamed to `dst` when the block succeeds and removed when it
    fails or is interrupted: a half-written `dst` never exists. `dst` must be new (or empty)."""
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise ModelDirError(f"{dst} already exists; choose a new directory")
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".partial", dir=dst.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the result is an ordinary directory
        yield tmp
        if dst.exists():
            dst.rmdir()
        tmp.rename(dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
