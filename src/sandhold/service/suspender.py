"""Suspend to disk, on a timer: a sandbox paused for ``suspend_after_s`` is checkpointed
(runtime/checkpoint/suspend.py), so that it holds no memory while it waits; resume restores it
whichever
way it was paused. Off where CRIU is not usable (said once in the log), or with
``suspend_after_s`` negative."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from sandhold.errors import Conflict, SandboxNotFound, SandholdError
from sandhold.runtime.checkpoint.criu import criu_status

if TYPE_CHECKING:
    from sandhold.config import Settings
    from sandhold.runtime.records import SandboxInfo
    from sandhold.runtime.runtime import Runtime
    from sandhold.service.offload import Offload
    from sandhold.service.prom import ServiceMetrics

log = logging.getLogger(__name__)


class Suspender:
    def __init__(
        self,
        runtime: Runtime,
        settings: Settings,
        offload: Offload,
        prom: ServiceMetrics,
        *,
        lock: Callable[[str], contextlib.AbstractAsyncContextManager[None]],
        list_now: Callable[[], list[SandboxInfo]],
    ) -> None:
        self.runtime = runtime
        self.settings = settings
        self.offload = offload
        self.prom = prom
        self.lock = lock  # the service's per-sandbox lock: no resume or kill meanwhile
        self.list_now = list_now  # every sandbox's record (blocking: run through offload)
        self.after_s = settings.suspend_after_s
        self._failed: set[str] = set()  # a dump failed: not tried again by the timer
        self._warned = False

    @property
    def enabled(self) -> bool:
        if self.after_s < 0:
            return False
        ok, detail = criu_status(self.settings.criu_path)
        if not ok and not self._warned:
            self._warned = True
            log.warning("paused sandboxes stay in memory (no suspend to disk): %s", detail)
        return ok

    async def tick(self) -> None:
        if not self.enabled:
            return
        due = time.time() - self.after_s
        for info in await self.offload.run(self.list_now):
            if (
                info.state == "paused"
                and not info.suspended
                and info.id not in self._failed
                and (info.paused_at or 0) <= due
            ):
                await self.suspend(info.id)

    async def suspend(self, sandbox_id: str) -> None:
        """Checkpoint a paused sandbox now (under its lock); a failure is logged and kept."""
        async with self.lock(sandbox_id):
            try:
                with self.prom.timed("suspend", "disk"):
                    await self.offload.run(self.runtime.suspend, sandbox_id)
            except (Conflict, SandboxNotFound):
                pass  # resumed, killed or suspended meanwhile
            except SandholdError as e:
                self._failed.add(sandbox_id)
                log.error("sandbox %s stays paused in memory: %s", sandbox_id, e)
