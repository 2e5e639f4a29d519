"""Keeping the pools of sandboxes booted ahead (runtime/pool.py) filled to ``pool_sizes``: one
boot at a time in the background (creates keep the CPU they need), woken by every create and
otherwise every ``CHECK_S``, once creates have paused for ``pool_refill_quiet_ms`` (a burst
is served without boots beside it; at most ``MAX_DEFER_S``); a template whose boot fails waits
``RETRY_S``. Pooled sandboxes a
previous server left are killed at open; this server's are killed at close."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sandhold.errors import SandholdError

if TYPE_CHECKING:
    from sandhold.config import Settings
    from sandhold.runtime.pool import Pools
    from sandhold.service.offload import Offload

log = logging.getLogger(__name__)

CHECK_S = 5.0
RETRY_S = 60.0
MAX_DEFER_S = 1.0  # a refill waits for a pause in creates no longer than this


class Pooler:
    def __init__(self, pools: Pools, settings: Settings, offload: Offload) -> None:
        self.pools = pools
        self.settings = settings
        self.offload = offload
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failed_at: dict[str, float] = {}
        self._last_create = 0.0  # monotonic

    async def start(self) -> None:
        stale = await self.offload.run(self.pools.drain)
        if stale:
            log.info("killed %d pooled sandboxes a previous server left", stale)
        if self.settings.pool_sizes:
            self._task = asyncio.create_task(self._run(), name="sandhold-pool")

    def kick(self) -> None:
        self._last_create = time.monotonic()
        self._wake.set()

    async def _quiet(self) -> None:
        """Until creates have paused for ``pool_refill_quiet_ms``, or ``MAX_DEFER_S`` passed."""
        quiet = self.settings.pool_refill_quiet_ms / 1000
        deadline = time.monotonic() + MAX_DEFER_S
        while (left := self._last_create + quiet - time.monotonic()) > 0:
            if time.monotonic() >= deadline:
                return
            await asyncio.sleep(min(left, deadline - time.monotonic()))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.offload.run(self.pools.drain)

    def _short(self) -> str | None:
        """A template whose pool is below its size (and did not just fail to boot)."""
        now = time.time()
        for name, size in self.settings.pool_sizes.items():
            if now - self._failed_at.get(name, 0) < RETRY_S:
                continue
            if self.pools.ready(name) < size:
                return name
        return None

    async def _run(self) -> None:
        while True:
            name = self._short()
            if name is None:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), CHECK_S)
                except TimeoutError:
                    pass
                continue
            await self._quiet()
            try:
                await self.offload.run(self.pools.fill, name)
            except SandholdError as e:
                self._failed_at[name] = time.time()
                log.error("could not boot a pooled %s sandbox: %s", name, e)


def pool_metrics(pools: Pools, sizes: dict[str, int]) -> Iterator[Metric]:
    """Each pool's ready sandboxes and size, hand-outs and misses (prometheus_client families)."""
    ready = GaugeMetricFamily(
        "sandhold_pool_ready",
        "Sandboxes booted ahead and ready to hand out, per template.",
        labels=["template"],
    )
    size = GaugeMetricFamily(
        "sandhold_pool_size",
        "The pool size configured per template (pool_sizes).",
        labels=["template"],
    )
    for t, n in sorted(sizes.items()):
        ready.add_metric([t], pools.ready(t))
        size.add_metric([t], n)
    yield ready
    yield size
    yield CounterMetricFamily(
        "sandhold_pool_hits", "Creates served by a pooled sandbox.", value=pools.hits
    )
    yield CounterMetricFamily(
        "sandhold_pool_misses",
        "Creates of a pooled template that found none ready.",
        value=pools.misses,
    )
