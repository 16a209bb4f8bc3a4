"""The ids the built-in model may write beyond its corpus's: the most frequent `o200k_harmony` ids over text that
every Python ships (the standard library's sources: code, comments and docstrings, and `pydoc_data`, its
reference manual in prose), so that a call's arguments can copy the file names, paths, shell words, identifiers
and numbers people type, not only the corpus's words.

The list depends on the Python that trains (its standard library); the artifact records the ids it was trained
with (`vocab_ids`, `target_ids`), so serving never rebuilds it."""

from __future__ import annotations

import collections
import functools
import sysconfig
from pathlib import Path

import numpy as np

from service.vocab import load_harmony

# Directories of the standard library left out: tests (generated data, odd strings), IDLE and site-packages.
_SKIPPED_PARTS = frozenset({"test", "tests", "idlelib", "site-packages", "__pycache__"})
FIRST_SPECIAL_ID = 199998  # o200k_harmony's special tokens start here; none is ever a text token


def standard_library_files(root: Path | None = None) -> list[Path]:
    """The standard library's .py files, in a fixed order."""
    root = root or Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if not _SKIPPED_PARTS.intersection(p.relative_to(root).parts))


def frequent_ids(files: list[Path]) -> list[int]:
    """Text token ids by descending count over `files` (ties by id), leaving out ids that decode to part of a
    character (they cannot be copied as text on their own)."""
    enc = load_harmony()
    counts: collections.Counter[int] = collections.Counter()
    for path in files:
        counts.update(enc.encode(path.read_text(encoding="utf-8", errors="replace"), disallowed_special=()))
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [tid for tid, _ in ranked if tid < FIRST_SPECIAL_ID and "\ufffd" not in enc.decode([tid])]


def writable_ids(corpus_targets: np.ndarray, size: int, files: list[Path] | None = None) -> np.ndarray:
    """Sorted ids: every corpus target, then the most frequent standard-library ids until there are `size`
    (or all of the corpus's, if it writes more). `size` 0: the corpus's alone."""
    chosen = {int(t) for t in corpus_targets.tolist()}
    if size > len(chosen):
        for tid in frequent_ids(files) if files is not None else _standard_library_ranking():
            if len(chosen) >= size:
                break
            chosen.add(tid)
    return np.array(sorted(chosen), dtype=np.int32)


@functools.cache
def _standard_library_ranking() -> tuple[int, ...]:
    """frequent_ids over the standard library, once a process (about 7 s)."""
    return tuple(frequent_ids(standard_library_files()))
