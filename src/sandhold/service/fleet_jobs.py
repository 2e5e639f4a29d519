"""A fleet host's own work on its sandboxes (docs/fleet.md): keeping paused ones in the shared
store, taking up sandboxes an edge hands it, and draining.

- **Storing** (every second): a sandbox paused for ``fleet_store_after_s`` is stored
  (migration.py). Until it is, its memory lives only here and dies with the host;
  ``unstored()`` counts those for the metrics.
- **Adopting**: an edge gives this host a sandbox at a newer generation (migration.adopt), and
  with ``resume`` (traffic for a sandbox that was running when its host drained) resumes it.
- **Templates**: a team's templates are kept in step with the shared store
  (template_sync.py), so every host can start them.
- **Draining** (SIGTERM, or ``POST /fleet/drain``): no more creates; every running sandbox is
  paused, every sandbox stored; then the host waits until an edge has polled its ``/fleet/info``
  twice after that (its second poll comes after it wrote the first's news in the catalog),
  within ``fleet_drain_timeout_s``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import TYPE_CHECKING

from sandhold.errors import Conflict, SandboxNotFound, SandholdError
from sandhold.service import migration
from sandhold.service.fleet import generation_of
from sandhold.service.fleet import of as fleet_of
from sandhold.service.template_sync import TemplateSync
from sandhold.service.timers import Periodic

if TYPE_CHECKING:
    from sandhold.config import Settings
    from sandhold.runtime.records import SandboxInfo
    from sandhold.service.records import Sandbox
    from sandhold.service.service import SandboxService

log = logging.getLogger(__name__)

STORE_CHECK_S = 1.0


class FleetJobs:
    def __init__(self, service: SandboxService, settings: Settings) -> None:
        self.service = service
        self.settings = settings
        self.store = migration.remote(settings)
        self.draining = False
        self.polled_at = 0.0  # when an edge last read /fleet/info
        self._drain: asyncio.Task[None] | None = None
        self._failed: set[str] = set()
        self._timer = Periodic(self.tick, STORE_CHECK_S, "sandhold-fleet-store")
        self.templates = (
            None if self.store is None else TemplateSync(service.runtime, settings, service.offload)
        )

    def start(self) -> None:
        if self.store is None:
            log.warning(
                "fleet host without a shared store (snapshot_s3_bucket): a paused sandbox "
                "dies with this host, and draining cannot hand sandboxes over"
            )
        self._timer.start()
        if self.templates is not None:
            self.templates.start()

    async def stop(self) -> None:
        await self._timer.stop()
        if self.templates is not None:
            await self.templates.stop()

    # -- storing -------------------------------------------------------------------------------
    def due(self, info: SandboxInfo, now: float) -> bool:
        """A paused sandbox whose memory is not in the store yet, paused long enough."""
        if info.state != "paused" or info.suspended == "filesystem" or info.failure:
            return False
        if migration.stored_generation(info) == generation_of(info.extra):
            return False
        return (info.paused_at or 0) <= now - self.settings.fleet_store_after_s

    def unstored(self, sandboxes: list[Sandbox]) -> int:
        return sum(1 for s in sandboxes if self.due(s.info, float("inf")))

    async def tick(self) -> None:
        if self.store is None or self.draining:
            return
        now = time.time()
        for sbx in await self.service.query():
            if sbx.id not in self._failed and self.due(sbx.info, now):
                await self.store_one(sbx.id)

    async def store_one(self, sandbox_id: str) -> bool:
        assert self.store is not None
        async with self.service.lock(sandbox_id):
            try:
                info = await self.service.offload.run(
                    migration.store, self.service.runtime, self.store, sandbox_id
                )
            except (Conflict, SandboxNotFound):
                return False  # resumed or killed meanwhile
            except SandholdError as e:
                self._failed.add(sandbox_id)
                log.error("sandbox %s is not in the shared store: %s", sandbox_id, e)
                return False
        log.info("sandbox %s stored at generation %d", sandbox_id, generation_of(info.extra))
        return True

    # -- adopting ------------------------------------------------------------------------------
    async def adopt(
        self, sandbox_id: str, generation: int, from_generation: int, resume: bool
    ) -> Sandbox:
        async with self.service.lock(sandbox_id):
            await self.service.offload.run(
                migration.adopt,
                self.service.runtime,
                self.store,
                sandbox_id,
                generation,
                from_generation,
            )
        sbx = await self.service.get(sandbox_id)
        assert sbx is not None
        if resume:
            sbx, _ = await self.service.connect(sbx.owner, sandbox_id, sbx.life.timeout)
        return sbx

    # -- draining ------------------------------------------------------------------------------
    def drain(self) -> asyncio.Task[None]:
        """Start draining (once); the task ends when the host may exit."""
        if self._drain is None:
            self.draining = True
            self._drain = asyncio.create_task(self._drain_all())
        return self._drain

    async def _drain_all(self) -> None:
        deadline = time.monotonic() + self.settings.fleet_drain_timeout_s
        log.warning("draining: no more creates; storing every sandbox")
        handed = 0
        for sbx in await self.service.query():
            if self.store is None or time.monotonic() > deadline:
                break
            try:
                if sbx.running:
                    await self.service.pause(sbx.owner, sbx.id)
                    marked = {**fleet_of(sbx.info.extra), "resume_on_call": True}
                    await self.service.offload.run(
                        functools.partial(self.service.runtime.update_extra, sbx.id, fleet=marked)
                    )
                if not sbx.failed:
                    handed += await self.store_one(sbx.id)
            except SandholdError as e:
                log.error("draining: sandbox %s stays on this host: %s", sbx.id, e)
        # Until an edge has seen what is stored and written it: its second poll from now (an
        # edge polls, settles the catalog, then polls again).
        seen, last = 0, time.time()
        while handed and seen < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            if self.polled_at > last:
                seen, last = seen + 1, self.polled_at
        log.warning("drained: %d sandboxes handed over", handed)
