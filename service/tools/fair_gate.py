"""A concurrency gate: at most `total` holders at once and at most `per_tenant` per tenant; waiters queue.

When a place frees, it goes to the waiter whose tenant holds the fewest places now, the earliest among equals:
a tenant with many queued executions cannot push another tenant's first one to the back of the line.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field


@dataclass
class _Waiter:
    seq: int
    tenant: str
    future: asyncio.Future[None]


@dataclass
class FairGate:
    total: int
    per_tenant: int
    held: Counter[str] = field(default_factory=Counter)
    _waiters: list[_Waiter] = field(default_factory=list)
    _seq: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @asynccontextmanager
    async def slot(self, tenant: str) -> AsyncIterator[None]:
        await self.acquire(tenant)
        try:
            yield
        finally:
            self.release(tenant)

    async def acquire(self, tenant: str) -> None:
        if not self._waiters and self._free(tenant):
            self.held[tenant] += 1
            return
        waiter = _Waiter(next(self._seq), tenant, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        self._grant()
        try:
            await waiter.future
        except BaseException:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            elif waiter.future.done() and not waiter.future.cancelled():
                self.release(tenant)  # granted just as the caller gave up
            raise

    def release(self, tenant: str) -> None:
        self.held[tenant] -= 1
        if self.held[tenant] <= 0:
            del self.held[tenant]
        self._grant()

    def _free(self, tenant: str) -> bool:
        return sum(self.held.values()) < self.total and self.held[tenant] < self.per_tenant

    def _grant(self) -> None:
        while self._waiters:
            ready = [w for w in self._waiters if self._free(w.tenant) and not w.future.done()]
            if not ready:
                return
            chosen = min(ready, key=lambda w: (self.held[w.tenant], w.seq))
            self._waiters.remove(chosen)
            self.held[chosen.tenant] += 1
            chosen.future.set_result(None)
