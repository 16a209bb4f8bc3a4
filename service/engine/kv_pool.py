"""The KV cache pool of shared-buffer graphs (GroupQueryAttention: ours, onnxruntime-genai's): one pooled
[slots, kv_heads, rows, d] buffer per layer and K/V. Each sequence owns one slot and the active sequences
always hold slots 0..n-1 (engine/core.py keeps them dense). A run binds the rows it needs by pointer, as both
past input and present output, so GQA writes the cache in place: nothing is copied per step."""

from __future__ import annotations

import json
import mmap
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort


class SlotPool:
    """One [capacity, kv_heads, rows, d] array per past tensor; slot i is row i of each.

    `rows` is max_context, or a sliding-window layer's cache capacity (GQA with sliding_window_cache
    keeps the most recent positions there and evicts on its own). Rows are bound to the session by
    pointer (a contiguous run of slots along axis 0 is one [slots, kv_heads, rows, d] tensor), so a
    batch over slots 0..n-1 needs no gather. Arrays are anonymous mappings (lazy_zeros): pages are
    committed only as GQA writes them, and growing never clears untouched rows. The pool grows by
    doubling, copying only each live slot's filled prefix."""

    def __init__(self, row_shapes: list[tuple[int, int, int]], dtype: type) -> None:
        self.row_shapes = row_shapes
        self.dtype = np.dtype(dtype)
        self.arrays: list[np.ndarray] = []
        self.capacity = 0
        self.generation = 0  # bumped whenever `arrays` are replaced: bindings to the old ones are stale

    def ensure(self, capacity: int, live: list[tuple[int, int]]) -> None:
        """Room for `capacity` slots; `live` are (slot, filled length) pairs to keep."""
        if capacity <= self.capacity:
            return
        new_cap = max(capacity, 2 * self.capacity, 1)
        arrays = [lazy_zeros((new_cap, *shape), self.dtype) for shape in self.row_shapes]
        for old, new in zip(self.arrays, arrays, strict=False):
            for slot, length in live:
                new[slot, :, :length] = old[slot, :, :length]  # a window cache's resident rows are a prefix
        self.arrays, self.capacity = arrays, new_cap
        self.generation += 1

    def clear(self) -> None:
        self.arrays, self.capacity = [], 0
        self.generation += 1

    def move(self, src: int, dst: int, length: int) -> None:
        for arr in self.arrays:
            arr[dst, :, :length] = arr[src, :, :length]

    def swap(self, a: int, b: int, len_a: int, len_b: int) -> None:
        for arr in self.arrays:
            keep = arr[a, :, :len_a].copy()
            arr[a, :, :len_b] = arr[b, :, :len_b]
            arr[b, :, :len_a] = keep

    def bind(self, io: ort.IOBinding, past_names: list[str], present_names: list[str], first: int, rows: int) -> None:
        for past, present, arr in zip(past_names, present_names, self.arrays, strict=True):
            shape = [rows, *arr.shape[1:]]
            ptr = arr[first].ctypes.data
            io.bind_input(past, "cpu", 0, self.dtype.type, shape, ptr)
            io.bind_output(present, "cpu", 0, self.dtype.type, shape, ptr)  # written in place


def lazy_zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zero array in an anonymous private mapping of its own: the kernel maps each page, zeroed, on its
    first write, so a KV pool costs memory only for the rows sequences fill, and growing it writes only the
    live rows it copies. (np.zeros of such sizes may come from the heap, where calloc clears every byte:
    seconds for a pool of 16 Qwen-shape slots, stalling every stream while a burst of newcomers is admitted.)"""
    count = int(np.prod(shape))
    buffer = mmap.mmap(-1, max(1, count * dtype.itemsize), flags=mmap.MAP_PRIVATE)
    return np.frombuffer(buffer, dtype=dtype, count=count).reshape(shape)


def window_capacities(model_dir: Path, extra: dict[str, Any]) -> dict[int, int]:
    """Layers whose KV cache is a sliding window (GQA sliding_window_cache): layer -> cache rows.

    Ours declare it in config.json ("kv_window"), onnxruntime-genai's in genai_config.json."""
    ours = extra.get("kv_window")
    if ours:
        return {int(layer): int(ours["capacity"]) for layer in ours["layers"]}
    path = model_dir / "genai_config.json"
    if not path.exists():
        return {}
    window = json.loads(path.read_text()).get("model", {}).get("decoder", {}).get("sliding_window")
    if not window:
        return {}
    capacity = int(window["window_size"]) + int(window.get("cache_slack", 0))
    return {int(layer): capacity for layer in window.get("layers", [])}
