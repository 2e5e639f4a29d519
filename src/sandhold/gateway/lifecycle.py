"""The reclaimer: the third stage of the lifecycle, run by every replica (default every 60 s).

A pass asks the provider for the sandboxes carrying this gateway's tag, and reclaims those that
are **paused** and whose provider-reported ``endAt`` (for a paused sandbox: when it paused) lies
more than the tenant's retention in the past. It judges by the provider's ``state`` and
``endAt`` only, never by what this replica saw, so replicas agree and restarts lose nothing.

Before it kills, it takes the session's lock without waiting (a session being resumed or created
is skipped until the next pass), re-reads the session (the sandbox must still be the session's),
makes sure no tool call is in flight (``session_uses``), and kills conditionally ("only if
still paused with the endAt I saw") where the provider can; elsewhere it re-reads the sandbox
just before the kill. A failed sandbox (its agent died) is listed as paused and reclaimed the
same way. The same pass records pauses (and failures) in the timeline and kills orphans: tagged
sandboxes no session owns (a replica died between create and record), once older than a grace.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict, dataclass

from sandhold.gateway.providers.base import PreconditionFailed, ProviderSandbox
from sandhold.gateway.sessions import SandboxSessionManager
from sandhold.store.db import SessionRow

log = logging.getLogger(__name__)

CONCURRENCY = 16  # kills in flight at once during a pass


@dataclass
class PassReport:
    listed: int = 0
    paused: int = 0
    reclaimed: int = 0
    skipped_in_use: int = 0
    skipped_locked: int = 0
    skipped_changed: int = 0
    orphans_killed: int = 0
    pauses_recorded: int = 0
    failures_recorded: int = 0
    errors: int = 0
    seconds: float = 0.0

    def public(self) -> dict[str, float]:
        return asdict(self)


class Reclaimer:
    def __init__(self, manager: SandboxSessionManager) -> None:
        self.m = manager
        self._task: asyncio.Task[None] | None = None

    def start(self, interval_s: float) -> None:
        self._task = asyncio.create_task(self._loop(interval_s), name="gateway-reclaimer")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self, interval_s: float) -> None:
        while True:
            try:
                report = await self.run_pass()
                if report.reclaimed or report.orphans_killed or report.errors:
                    log.info("reclaim pass: %s", report.public())
            except Exception:
                log.exception("reclaim pass failed")
            await asyncio.sleep(interval_s)

    async def run_pass(self) -> PassReport:
        t0 = time.monotonic()
        report = PassReport()
        sandboxes = await self.m.provider.list(self.m.gateway_tags())
        owners = await self.m.db(self.m.store.sessions_with_sandboxes)
        report.listed = len(sandboxes)
        retention: dict[str, float | None] = {}
        now = time.time()
        sem = asyncio.Semaphore(CONCURRENCY)

        async def one(sbx: ProviderSandbox) -> None:
            async with sem:
                try:
                    await self._judge(sbx, owners.get(sbx.id), retention, now, report)
                except Exception:
                    report.errors += 1
                    log.exception("reclaimer could not handle sandbox %s", sbx.id)

        await asyncio.gather(*(one(s) for s in sandboxes))
        report.seconds = round(time.monotonic() - t0, 4)
        return report

    async def _retention(self, tenant_id: str, cache: dict[str, float | None]) -> float | None:
        if tenant_id not in cache:
            try:
                cache[tenant_id] = (await self.m.policy(tenant_id)).retention_s
            except Exception:
                cache[tenant_id] = None  # unknown tenant: leave its sandboxes alone
        return cache[tenant_id]

    async def _judge(
        self,
        sbx: ProviderSandbox,
        owner: SessionRow | None,
        retention_cache: dict[str, float | None],
        now: float,
        report: PassReport,
    ) -> None:
        session_id = sbx.metadata.get(self.m.tag_session)
        tenant_id = sbx.metadata.get(self.m.tag_tenant)
        if not session_id or not tenant_id:
            return  # not a session sandbox of ours
        if owner is None:
            old_enough = now - sbx.started_at > self.m.settings.gateway_orphan_grace_s
            if old_enough and await self._kill_orphan(sbx, tenant_id, session_id):
                report.orphans_killed += 1
            return
        if sbx.state != "paused" or sbx.end_at is None:
            return  # running, or "pausing" (CubeSandbox): not yet
        report.paused += 1
        if await self.m.record_stop(owner, sbx):
            if sbx.failure is None:
                report.pauses_recorded += 1
            else:
                report.failures_recorded += 1
        retention = await self._retention(owner.tenant_id, retention_cache)
        if retention is None or now - sbx.end_at < retention:
            return
        await self._reclaim(sbx, owner, retention, now, report)

    async def _reclaim(
        self, sbx: ProviderSandbox, owner: SessionRow, retention: float, now: float,
        report: PassReport,
    ) -> None:  # fmt: skip
        token = await self.m.db(self.m.store.try_lock, owner.pk, self.m.settings.gateway_lock_ttl_s)
        if token is None:
            report.skipped_locked += 1  # a call is resuming or creating right now
            return
        try:
            fresh = await self.m.db(self.m.store.session_by_pk, owner.pk)
            if fresh is None or fresh.sandbox_id != sbx.id:
                report.skipped_changed += 1
                return
            if await self.m.db(self.m.store.live_uses, owner.pk):
                report.skipped_in_use += 1
                return
            t0 = time.monotonic()
            if self.m.provider.capabilities.conditional_delete:
                try:
                    await self.m.provider.kill(sbx.id, if_paused_end_at=sbx.end_at)
                except PreconditionFailed:
                    report.skipped_changed += 1
                    return
            else:
                current = await self.m.provider.get(sbx.id)
                if current is not None and (
                    current.state != "paused" or current.end_at != sbx.end_at
                ):
                    report.skipped_changed += 1
                    return
                await self.m.provider.kill(sbx.id)
            if not await self.m.db(self.m.store.set_sandbox, owner.pk, token, None, None):
                log.warning("lost the lock of session %s while reclaiming", owner.session_id)
            report.reclaimed += 1
            assert sbx.end_at is not None
            await self.m.timeline.record(
                owner.tenant_id, owner.session_id, "sandbox_reclaimed", sandbox_id=sbx.id,
                duration_ms=round((time.monotonic() - t0) * 1000, 2),
                reason=f"{'failed' if sbx.failure else 'paused'} for {now - sbx.end_at:.1f} s "
                       f">= retention {retention:g} s",
                provider_state=sbx.public(),
            )  # fmt: skip
        finally:
            await self.m.db(self.m.store.unlock, owner.pk, token)

    async def _kill_orphan(self, sbx: ProviderSandbox, tenant_id: str, session_id: str) -> bool:
        row = await self.m.db(self.m.store.get_session, tenant_id, session_id)
        token = None
        if row is not None:
            token = await self.m.db(
                self.m.store.try_lock, row.pk, self.m.settings.gateway_lock_ttl_s
            )
            if token is None:
                return False  # its session is being changed: maybe this is being recorded now
        try:
            if row is not None:
                fresh = await self.m.db(self.m.store.session_by_pk, row.pk)
                if fresh is not None and fresh.sandbox_id == sbx.id:
                    return False  # recorded meanwhile: not an orphan
            killed = await self.m.provider.kill(sbx.id)
            if killed:
                await self.m.timeline.record(
                    tenant_id, session_id, "sandbox_orphan_killed", sandbox_id=sbx.id,
                    reason="tagged sandbox that no session owns (its creator died)",
                    provider_state=sbx.public(),
                )  # fmt: skip
            return killed
        finally:
            if row is not None and token is not None:
                await self.m.db(self.m.store.unlock, row.pk, token)
