"""A Hugging Face checkpoint directory as people download it: config.json, one or more `*.safetensors` files
(with `model.safetensors.index.json` when sharded), tokenizer files, generation_config.json.

Tensors are read one at a time through the `safetensors` package's numpy API (`safe_open(...,
framework="numpy")`, memory-mapped: a tensor costs its own size, never the file's) and converted to
float32. BF16 tensors come through the same API: it names their numpy dtype "bfloat16", which numpy knows
once `ml_dtypes` (a dependency of onnx, so always installed here) is imported; `astype(float32)` is then
exact (a bf16 value is the top half of a float32). No raw-byte decoding of our own. (ml_dtypes is imported
when a checkpoint is opened, not with this module: it takes seconds, and the server's start-up checks
whether SERVICE_MODEL is a checkpoint through model_dir.is_checkpoint_dir without it.)

The content hash that keys the model cache is a SHA-256 over config.json's bytes and, for every
safetensors file in name order, its name, size and full SHA-256 (not only the headers: two fine-tunes of
one base model have identical headers). Hashing reads every byte once; a memo file (size, mtime and inode
per path) makes the next start a stat per file."""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError, safe_open

from service.engine.model_files import ModelDirError

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
_FLOAT_DTYPES = {"F32", "F16", "BF16", "F64"}


def abbreviated(names: list[str], limit: int = 8) -> list[str]:
    """The first `limit` names, then how many more."""
    return names if len(names) <= limit else [*names[:limit], f"... ({len(names) - limit} more)"]


class Checkpoint:
    """config.json plus the tensors of the directory's safetensors files, by name."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise ModelDirError(f"{self.path} is not a directory")
        config_path = self.path / CONFIG_FILE
        if not config_path.is_file():
            raise ModelDirError(f"{self.path} is not a Hugging Face checkpoint: no {CONFIG_FILE} in it")
        import ml_dtypes  # noqa: F401 - registers numpy's "bfloat16" dtype, which safetensors' numpy API returns

        self.config = _json_object(config_path)
        self.files = self._weight_files()
        self._stack = ExitStack()
        self._handles: dict[Path, Any] = {}
        self._where: dict[str, Path] = {}
        for file in self.files:
            for name in self._open(file).keys():  # noqa: SIM118 - safe_open is not a mapping
                self._where.setdefault(name, file)

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type") or "unknown")

    @property
    def architecture(self) -> str:
        architectures = self.config.get("architectures") or []
        return str(architectures[0]) if architectures else self.model_type

    def names(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def dtype(self, name: str) -> str:
        """The stored dtype as safetensors names it: F32, F16, BF16, U8, ..."""
        return str(self._slice(name).get_dtype())

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(n) for n in self._slice(name).get_shape())

    def raw(self, name: str) -> np.ndarray:
        """The tensor as stored (bf16 as ml_dtypes.bfloat16, U8 as uint8, ...)."""
        return np.asarray(self._handle(name).get_tensor(name))

    def get(self, name: str) -> np.ndarray:
        """A floating-point tensor as float32 (F16, BF16 and F32 exactly; F64 rounded)."""
        kind = self.dtype(name)
        if kind not in _FLOAT_DTYPES:
            raise ModelDirError(f"{self.path}: tensor {name} is {kind}, not a floating-point weight")
        return np.ascontiguousarray(self.raw(name), dtype=np.float32)

    def dtypes(self) -> dict[str, int]:
        """How many tensors are stored in each dtype."""
        return dict(Counter(self.dtype(n) for n in self._where))

    def parameter_count(self) -> int:
        return sum(int(np.prod(self.shape(n), dtype=np.int64)) for n in self._where)

    def require(self, names: list[str]) -> None:
        """ModelDirError naming every tensor of `names` the checkpoint lacks."""
        missing = [n for n in names if n not in self._where]
        if missing:
            listed = ", ".join(abbreviated(missing))
            raise ModelDirError(f"{self.path} ({self.architecture}): missing {len(missing)} tensor(s): {listed}")

    def file_hashes(self, memo: Path | None = None) -> dict[str, str]:
        """SHA-256 of each safetensors file, by name; `memo` (a JSON file) remembers them by path, size,
        mtime and inode, so an unchanged file is not read again."""
        known = _read_memo(memo) if memo is not None else {}
        hashes, changed = {}, False
        for file in self.files:
            key, stamp = str(file.resolve()), _stamp(file)
            entry = known.get(key)
            if entry is None or entry.get("stamp") != stamp:
                entry = {"stamp": stamp, "sha256": _sha256(file)}
                known[key], changed = entry, True
            hashes[file.name] = str(entry["sha256"])
        if memo is not None and changed:
            _write_memo(memo, known)
        return hashes

    def content_hash(self, memo: Path | None = None) -> str:
        """SHA-256 over config.json and every safetensors file's name, size and SHA-256 (see the module)."""
        digest = hashlib.sha256((self.path / CONFIG_FILE).read_bytes())
        for name, sha in sorted(self.file_hashes(memo).items()):
            size = (self.path / name).stat().st_size
            digest.update(f"\n{name}\t{size}\t{sha}".encode())
        return digest.hexdigest()

    def describe(self, content_hash: str, file_hashes: dict[str, str]) -> dict[str, Any]:
        """What an import records about its source (config.json's `source`; `model info` prints it)."""
        return {
            "format": "huggingface-safetensors",
            "path": str(self.path.resolve()),
            "model_type": self.model_type,
            "architecture": self.architecture,
            "parameters": self.parameter_count(),
            "dtypes": self.dtypes(),
            "torch_dtype": self.config.get("torch_dtype") or self.config.get("dtype"),
            "sha256": content_hash,
            "files": file_hashes,
        }

    def close(self) -> None:
        self._handles.clear()
        self._stack.close()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _weight_files(self) -> list[Path]:
        index = self.path / INDEX_FILE
        if index.is_file():
            weight_map = _json_object(index).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ModelDirError(f"{index} has no weight_map")
            files = [self.path / str(f) for f in sorted(set(weight_map.values()))]
            absent = [f.name for f in files if not f.is_file()]
            if absent:
                raise ModelDirError(f"{self.path}: {INDEX_FILE} names files that are not there: {', '.join(absent)}")
            return files
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            raise ModelDirError(f"{self.path} holds no *.safetensors weights")
        return files

    def _open(self, file: Path) -> Any:
        if file not in self._handles:
            try:
                self._handles[file] = self._stack.enter_context(safe_open(str(file), framework="numpy"))
            except (SafetensorError, OSError) as exc:
                raise ModelDirError(f"{file} is not a readable safetensors file: {exc}") from exc
        return self._handles[file]

    def _handle(self, name: str) -> Any:
        if name not in self._where:
            self.require([name])
        return self._open(self._where[name])

    def _slice(self, name: str) -> Any:
        return self._handle(name).get_slice(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)


def _json_object(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelDirError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelDirError(f"{path} is not a JSON object")
    return data


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _read_memo(memo: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(memo.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_memo(memo: Path, entries: dict[str, dict[str, Any]]) -> None:
    """Written beside and renamed over: a reader sees the old memo or the new one."""
    memo.parent.mkdir(parents=True, exist_ok=True)
    tmp = memo.with_name(f".{memo.name}.{os.getpid()}")
    tmp.write_text(json.dumps(entries, indent=1, sort_keys=True))
    tmp.replace(memo)
