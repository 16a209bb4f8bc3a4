"""The shared KV cache pool: memory only for the rows sequences write, and growth that keeps live rows and
touches nothing else (a burst of newcomers grows it while every stream waits)."""

from __future__ import annotations

import resource

import numpy as np

from service.engine.kv_pool import SlotPool, lazy_zeros

PAGE = resource.getpagesize()


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def test_a_lazy_array_is_zero_and_costs_memory_only_where_written() -> None:
    before = _resident_bytes()
    arr = lazy_zeros((64, 2, 4096, 64), np.dtype(np.float32))  # 128 MiB of address space
    assert arr.flags.writeable and arr.nbytes == 128 << 20
    arr[3, :, :10] = 1.5
    assert float(arr[3, 1, 9, 63]) == 1.5 and not arr[3, :, 10:20].any() and not arr[63].any()
    assert _resident_bytes() - before < 16 << 20  # a few pages written (and read), not 128 MiB


def test_growing_the_pool_keeps_each_live_slots_rows() -> None:
    pool = SlotPool([(2, 256, 8)] * 4, np.float32)
    pool.ensure(2, [])
    rng = np.random.default_rng(0)
    filled = {0: 17, 1: 200}
    for slot, length in filled.items():
        for arr in pool.arrays:
            arr[slot, :, :length] = rng.standard_normal((2, length, 8))
    kept = [[arr[slot, :, :length].copy() for slot, length in filled.items()] for arr in pool.arrays]
    pool.ensure(3, list(filled.items()))
    assert pool.capacity == 4
    for arr, rows in zip(pool.arrays, kept, strict=True):
        assert arr.shape == (4, 2, 256, 8)
        for (slot, length), old in zip(filled.items(), rows, strict=True):
            assert np.array_equal(arr[slot, :, :length], old)
        assert not arr[2:].any()
