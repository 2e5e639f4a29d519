"""Keeping the checkpoints of templates that start warm (runtime/checkpoint/warm.py): every
``WARM_CHECK_S``, and at once after a create that found none (that create booted cold), each
built template that starts warm without a current checkpoint gets one, one build at a time, in
the background. A build that fails is logged and tried again only after ``RETRY_S``. Off with
``warm_templates=false`` or where CRIU is not usable (said once in the log)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from sandhold.errors import SandholdError
from sandhold.runtime.checkpoint.criu import criu_status

if TYPE_CHECKING:
    from sandhold.config import Settings
    from sandhold.runtime.runtime import Runtime
    from sandhold.service.offload import Offload

log = logging.getLogger(__name__)

WARM_CHECK_S = 30.0
RETRY_S = 600.0


class Warmer:
    def __init__(self, runtime: Runtime, settings: Settings, offload: Offload) -> None:
        self.runtime = runtime
        self.settings = settings
        self.offload = offload
        self._failed_at: dict[str, float] = {}
        self._running: asyncio.Task[None] | None = None
        self._warned = False

    @property
    def enabled(self) -> bool:
        settings = self.settings
        if not settings.warm_templates or not settings.disk_enforced:
            return False
        ok, detail = criu_status(settings.criu_path)
        if not ok and not self._warned:
            self._warned = True
            log.warning("templates that start warm boot cold here: %s", detail)
        return ok

    def kick(self) -> None:
        """Check now (in the background), unless a check is running."""
        if self._running is None or self._running.done():
            self._running = asyncio.create_task(self.tick(), name="sandhold-warm")

    async def tick(self) -> None:
        if not self.enabled:
            return
        rt = self.runtime
        for template in await self.offload.run(rt.templates.list):
            name = template.name
            if not template.warm or template.stub:  # (a stub's files come at its first use)
                continue
            if time.time() - self._failed_at.get(name, 0) < RETRY_S:
                continue
            if template.owner is not None and not template.tags:
                continue  # a team's build no name points at (replaced or deleted): going
            if await self.offload.run(rt.warm.available, template) is not None:
                continue
            try:
                await self.offload.run(rt.warm.build, name)
            except SandholdError as e:
                self._failed_at[name] = time.time()
                log.error("template %s boots cold (its checkpoint failed): %s", name, e)

    async def close(self) -> None:
        if self._running is not None:
            await asyncio.gather(self._running, return_exceptions=True)
