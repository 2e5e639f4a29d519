"""The timer: every ``interval_s`` it expires each running sandbox whose stored end time has
passed (pause with on_timeout=pause, else kill), and removes a failed one made to be killed.
``Periodic`` runs other upkeep (the runtime's reconcile) on an interval of its own.

It keeps no timers of its own: the due list is recomputed from the runtime's records on every
tick, so a sandbox that fell due while the server was down is handled on the first tick after
start, and a timeout changed by any request is seen on the next tick.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from sandhold.service.records import Sandbox

log = logging.getLogger(__name__)


class Timer:
    def __init__(
        self,
        listing: Callable[[], Awaitable[list[Sandbox]]],
        expire: Callable[[str], Awaitable[None]],
        interval_s: float,
    ) -> None:
        self._listing = listing
        self._expire_one = expire
        self._loop = Periodic(self.tick, interval_s, "lifecycle tick", at_start=True)
        self._expiring: dict[str, asyncio.Task[None]] = {}

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
        tasks = list(self._expiring.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def tick(self) -> None:
        now = time.time()
        for sbx in await self._listing():
            if sbx.expires and sbx.life.end_at <= now and sbx.id not in self._expiring:
                self._expiring[sbx.id] = asyncio.create_task(self._expire(sbx.id))

    async def _expire(self, sandbox_id: str) -> None:
        try:
            await self._expire_one(sandbox_id)
        except Exception:
            log.exception("could not expire sandbox %s", sandbox_id)
        finally:
            self._expiring.pop(sandbox_id, None)


class Periodic:
    """Runs ``run`` every ``interval_s`` (the first time at ``start`` with ``at_start``, else
    one interval after it) until stopped; a failed run is logged and the next one comes anyway."""

    def __init__(
        self,
        run: Callable[[], Awaitable[object]],
        interval_s: float,
        name: str,
        *,
        at_start: bool = False,
    ) -> None:
        self._run_once = run
        self.interval_s = interval_s
        self.name = name
        self.at_start = at_start
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        if not self.at_start:
            await asyncio.sleep(self.interval_s)
        while True:
            try:
                await self._run_once()
            except Exception:
                log.exception("%s failed", self.name)
            await asyncio.sleep(self.interval_s)
