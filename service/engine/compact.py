"""A decoder trained over a compact vocabulary, stored small, expanded to the full vocabulary.

The artifact is one `.npz`: the weights (float16, Hugging Face names, compact rows), `vocab_ids`
(compact row i >= 1 is vocabulary id vocab_ids[i - 1]; row 0 stands for every id the training
corpus never used) and `target_ids` (the ids the model was trained to write). Expanding it gives the
weights the graph builder takes (`graph_weights`), both tables still compact: unseen input ids share row 0's
embedding, and the head computes only the `target_ids`, every other id getting a logit of -1e4 (no
probability mass)."""

from __future__ import annotations

import hashlib
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from service.engine.config import DecoderConfig
from service.engine.model_files import ModelDirError

UNSEEN_LOGIT = -1e4  # exp(-1e4) is 0 in float32: ids the model never wrote cannot be sampled
_TABLES = ("model.embed_tokens.weight", "lm_head.weight")
EMBED_INDEX = "model.embed_tokens.index"  # int64 [vocab]: the compact embedding row of each id
HEAD_IDS = "lm_head.ids"  # int64 [n], ascending: the id of each compact head row


class ArtifactError(RuntimeError):
    """The stored model is missing, corrupt, or not the one its manifest describes."""


@dataclass
class CompactModel:
    weights: dict[str, np.ndarray]  # float32, compact rows for the two vocabulary tables
    vocab_ids: np.ndarray
    target_ids: np.ndarray


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def save_compact(path: Path, model: CompactModel) -> str:
    """Write the artifact deterministically (fixed zip timestamps, sorted names); returns its SHA-256."""
    arrays: dict[str, np.ndarray] = {name: w.astype(np.float16) for name, w in model.weights.items()}
    arrays["vocab_ids"] = model.vocab_ids.astype(np.int32)
    arrays["target_ids"] = model.target_ids.astype(np.int32)
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for name in sorted(arrays):
            buf = io.BytesIO()
            np.save(buf, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, buf.getvalue(), compresslevel=9)
    return sha256_file(path)


def load_compact(path: Path, sha256: str) -> CompactModel:
    """Read the artifact after checking its SHA-256 against the manifest's."""
    if not path.is_file():
        raise ArtifactError(f"model artifact {path} is missing")
    actual = sha256_file(path)
    if actual != sha256:
        raise ArtifactError(f"model artifact {path} has SHA-256 {actual}, its manifest says {sha256}")
    with np.load(path, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    vocab_ids, target_ids = arrays.pop("vocab_ids"), arrays.pop("target_ids")
    return CompactModel({k: v.astype(np.float32) for k, v in arrays.items()}, vocab_ids, target_ids)


def graph_weights(model: CompactModel, config: DecoderConfig) -> dict[str, np.ndarray]:
    """The weights the contrib graph builder takes for `config` (vocab_size = the tokenizer's), the two
    vocabulary tables kept compact: `model.embed_tokens.weight` is the artifact's (row 0 for every unseen id)
    with EMBED_INDEX giving each id its row, and `lm_head.weight` holds only the rows of the ids in HEAD_IDS
    (`target_ids`), so that a step computes the logits of the ids the model writes, not the whole vocabulary's
    (the graph gives every other id UNSEEN_LOGIT)."""
    ids = model.vocab_ids.astype(np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= config.vocab_size):
        raise ArtifactError(f"artifact ids fall outside the {config.vocab_size}-id vocabulary")
    w = {k: v for k, v in model.weights.items() if k not in _TABLES}
    index = np.zeros(config.vocab_size, dtype=np.int64)
    index[ids] = np.arange(1, ids.size + 1)
    w["model.embed_tokens.weight"] = model.weights["model.embed_tokens.weight"]
    w[EMBED_INDEX] = index
    targets = np.unique(model.target_ids.astype(np.int64))
    if not np.isin(targets, ids).all():
        raise ArtifactError("the artifact's target ids are not all among its vocabulary ids")
    w["lm_head.weight"] = model.weights["lm_head.weight"][index[targets]]
    w[HEAD_IDS] = targets
    return w


# A model directory whose graph has a compact head names this file in its config ("head_ids"): its ids, for the
# sampler, which then draws over them alone (sampling.sample's `support`) without reading the graph.
HEAD_IDS_FILE = "head_ids.npy"


def write_head_ids(model_dir: Path, ids: np.ndarray) -> dict[str, str]:
    """Save the compact head's ids beside the graph; returns the config entry that names the file."""
    np.save(model_dir / HEAD_IDS_FILE, np.ascontiguousarray(ids, dtype=np.int64), allow_pickle=False)
    return {"head_ids": HEAD_IDS_FILE}


def read_head_ids(model_dir: Path, extra: dict[str, object], vocab_size: int) -> np.ndarray | None:
    """The compact head's ids (ascending, unique, inside the vocabulary) a config names, or None for a full head."""
    name = extra.get("head_ids")
    if name is None:
        return None
    path = Path(model_dir) / str(name)
    try:
        ids = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ModelDirError(f"{model_dir}/config.json names head ids in {name}, which cannot be read: {exc}") from exc
    if ids.ndim != 1 or ids.size == 0 or ids[0] < 0 or ids[-1] >= vocab_size or np.any(np.diff(ids) <= 0):
        raise ModelDirError(f"{path} does not hold ascending ids inside the {vocab_size}-id vocabulary")
    return np.asarray(ids, dtype=np.int64)
