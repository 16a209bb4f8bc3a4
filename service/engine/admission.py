"""Admission by memory: how many runs may generate at once, from what one run's KV cache can grow to.

A run's KV cache holds K and V for every layer, kv head and position up to the model's context (a
sliding-window layer: its window), so one run may need `kv_bytes_per_sequence()` bytes; the engine
commits those pages only as it writes them, so this is the worst case a budget must cover. Runs beyond
`budget // per_run` wait in the durable queue (the log) until a running one ends.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Protocol, runtime_checkable

log = logging.getLogger(__name__)

# Share of the machine's memory the KV caches may take by default (weights, Python, the database
# and the page cache need the rest).
DEFAULT_BUDGET_SHARE = 0.25
# Without a measurable KV cache (an engine that does not say), the old fixed count.
FALLBACK_ACTIVE_RUNS = 8


@runtime_checkable
class SizedKvCache(Protocol):
    def kv_bytes_per_sequence(self) -> int:
        """Bytes of KV cache one sequence may fill (at its longest)."""
        ...


def machine_memory_bytes() -> int:
    """Physical memory, or the cgroup (container) limit when that is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            raw = Path(path).read_text().strip()
        except OSError:
            continue
        if raw.isdigit():
            total = min(total, int(raw))
    return int(total)


def default_budget_bytes() -> int:
    return int(machine_memory_bytes() * DEFAULT_BUDGET_SHARE)


def active_run_limit(per_run_bytes: int | None, budget_bytes: int | None, cap: int | None) -> int:
    """Runs that may generate at once: as many KV caches as fit the budget (at least one), and at most
    `cap` when one is set. `per_run_bytes` None (unknown) falls back to `cap` or FALLBACK_ACTIVE_RUNS."""
    if per_run_bytes is None or per_run_bytes <= 0:
        return cap or FALLBACK_ACTIVE_RUNS
    budget = default_budget_bytes() if budget_bytes is None else budget_bytes
    fits = max(1, budget // per_run_bytes)
    return min(fits, cap) if cap is not None else fits


def limit_for_engine(engine: object, budget_bytes: int | None, cap: int | None) -> int:
    """active_run_limit for a running engine (one that reports its KV cache size, else the fallback)."""
    per_run = engine.kv_bytes_per_sequence() if isinstance(engine, SizedKvCache) else None
    limit = active_run_limit(per_run, budget_bytes, cap)
    budget = default_budget_bytes() if budget_bytes is None else budget_bytes
    if per_run is not None:
        log.info(
            "admission: up to %d active runs (KV cache %.1f MiB per run, budget %.1f MiB%s)",
            limit,
            per_run / 2**20,
            budget / 2**20,
            f", capped at {cap}" if cap is not None else "",
        )
    return limit
