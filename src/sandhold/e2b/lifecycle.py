"""The timer: every ``lifecycle_interval_s`` it kills (or pauses, with ``autoPause``) each running
sandbox whose stored ``endAt`` has passed.

It keeps no timers of its own: the due list is recomputed from the runtime's records on every
tick, so a sandbox that fell due while the server was down is handled on the first tick after
start, and a timeout changed by any request is seen on the next tick.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sandhold.e2b.sandboxes import Sandboxes

log = logging.getLogger(__name__)


class Lifecycle:
    def __init__(self, sandboxes: Sandboxes, interval_s: float) -> None:
        self.sandboxes = sandboxes
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self._expiring: dict[str, asyncio.Task[None]] = {}

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="sandhold-e2b-lifecycle")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._expiring.values()) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            try:
                self.tick()
            except Exception:
                log.exception("lifecycle tick failed")
            await asyncio.sleep(self.interval_s)

    def tick(self) -> None:
        now = time.time()
        for sbx in self.sandboxes.all():
            if sbx.running and sbx.st.end_at <= now and sbx.id not in self._expiring:
                task = asyncio.create_task(self._expire(sbx.id))
                self._expiring[sbx.id] = task

    async def _expire(self, sandbox_id: str) -> None:
        try:
            await self.sandboxes.expire(sandbox_id)
        except Exception:
            log.exception("could not expire sandbox %s", sandbox_id)
        finally:
            self._expiring.pop(sandbox_id, None)
