"""The reclaimer: the third stage of the lifecycle, run by every replica (default every 60 s).

A pass asks the provider for the sandboxes carrying this gateway's tag, once (one ``list``, not
a ``get`` per sandbox), and reclaims those that are **paused** and whose provider-reported
``endAt`` (for a paused sandbox: when it paused) lies more than the tenant's retention in the
past. It judges by the provider's ``state`` and ``endAt`` only, never by what this replica saw,
so replicas agree and restarts lose nothing.

A pass, step by step (``run_pass``):

1. The decisions are made in memory, from that list, one read of the sessions that have a
   sandbox and one of the tenants.
2. The pauses (and failures) seen are recorded in one transaction (``store/batch.py``). A failed
   sandbox (its agent died) is listed as paused and handled the same way.
3. The sandboxes due are reclaimed in batches, sized to the kills' pace (at most ``LOCK_BATCH``).
   One transaction takes their sessions' locks without waiting: a session being resumed or
   created is skipped until the next pass. It keeps only the sessions whose sandbox is still
   theirs and that have no tool call in flight (``session_uses``, read after the locks).
4. Their kills run in parallel, at most ``gateway_reclaim_concurrency`` at once. Each is
   conditional ("only if still paused with the endAt I saw") where the provider can; elsewhere
   the sandbox is read again just before its kill. No kill starts once the lease is close to
   running out.
5. One transaction clears the reclaimed sessions (fenced by the lock token), unlocks the batch
   and writes its events.
6. Orphans are killed: tagged sandboxes no session owns (a replica died between create and
   record), once older than a grace; they are rare, so one at a time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sandhold.gateway.policy import TenantPolicy
from sandhold.gateway.providers.base import PreconditionFailed, ProviderSandbox
from sandhold.gateway.sessions import SandboxSessionManager
from sandhold.gateway.timeline import stop_event
from sandhold.service.timers import Periodic
from sandhold.store.batch import Stop
from sandhold.store.db import SessionRow

log = logging.getLogger(__name__)

# Sessions locked (and their sandboxes killed) per batch of a pass: the first batch is small,
# the next ones as many as the kills so far would get through in BATCH_S (at least one per
# kill in flight, at most LOCK_BATCH), so that neither a lease nor a tool call waiting for a
# session of the batch waits long for slow kills, and fast ones cost few transactions.
LOCK_BATCH = 256
FIRST_BATCH_PER_KILLER = 4
BATCH_S = 2.0
LEASE_MARGIN = 0.5  # of the lock TTL: no kill is started later than this into the lease


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


@dataclass
class _Due:
    """A paused sandbox past its session's retention."""

    sbx: ProviderSandbox
    owner: SessionRow
    retention: float


class Reclaimer:
    def __init__(self, manager: SandboxSessionManager) -> None:
        self.manager = manager
        self._every: Periodic | None = None

    def start(self, interval_s: float) -> None:
        self._every = Periodic(self._pass, interval_s, "gateway reclaim pass", at_start=True)
        self._every.start()

    async def stop(self) -> None:
        if self._every is not None:
            await self._every.stop()

    async def _pass(self) -> None:
        report = await self.run_pass()
        if report.reclaimed or report.orphans_killed or report.errors:
            log.info("reclaim pass: %s", report.public())

    async def run_pass(self) -> PassReport:
        """One pass: list the gateway's sandboxes, record the stops no replica recorded yet,
        reclaim the paused ones past their session's retention, kill the orphans."""
        t0 = time.monotonic()
        report = PassReport()
        sandboxes = await self.manager.provider.list(self.manager.gateway_tags())
        report.listed = len(sandboxes)
        now = time.time()
        stops, due, orphans = await self._sort(sandboxes, now, report)
        await self._record_stops(stops, report)
        await self._reclaim(due, now, report)
        await self._kill_orphans(orphans, report)
        report.seconds = round(time.monotonic() - t0, 4)
        return report

    async def _sort(
        self, sandboxes: Sequence[ProviderSandbox], now: float, report: PassReport
    ) -> tuple[list[Stop], list[_Due], list[tuple[ProviderSandbox, str, str]]]:
        """The stops to record, the sandboxes due for reclaim and the orphans (a session tag
        but no session row, past the grace)."""
        owners = await self.manager.db(self.manager.store.sessions_with_sandboxes)
        retention = await self.manager.db(self._retentions)
        stops: list[Stop] = []
        due: list[_Due] = []
        orphans: list[tuple[ProviderSandbox, str, str]] = []
        for sbx in sandboxes:
            session_id = sbx.metadata.get(self.manager.tag_session)
            tenant_id = sbx.metadata.get(self.manager.tag_tenant)
            if not session_id or not tenant_id:
                continue  # not a session sandbox of ours
            owner = owners.get(sbx.id)
            if owner is None:
                if now - sbx.started_at > self.manager.settings.gateway_orphan_grace_s:
                    orphans.append((sbx, tenant_id, session_id))
                continue
            if sbx.state != "paused" or sbx.end_at is None:
                continue  # running, or "pausing" (CubeSandbox): not yet
            report.paused += 1
            if owner.recorded_pause_end_at != sbx.end_at:  # else recorded already
                stops.append(Stop(owner.pk, sbx.id, sbx.end_at, self._stop_event(owner, sbx)))
            kept = retention.get(owner.tenant_id)  # None: unknown tenant, leave it alone
            if kept is not None and now - sbx.end_at >= kept:
                due.append(_Due(sbx, owner, kept))
        return stops, due, orphans

    async def _record_stops(self, stops: list[Stop], report: PassReport) -> None:
        try:
            recorded = await self.manager.db(self.manager.store.record_stops, stops)
        except Exception:
            report.errors += 1
            log.exception("reclaimer could not record %d pauses", len(stops))
            return
        failed = sum(1 for s in stops if s.pk in recorded and s.event["kind"] != "sandbox_paused")
        report.failures_recorded += failed
        report.pauses_recorded += len(recorded) - failed

    async def _reclaim(self, due: list[_Due], now: float, report: PassReport) -> None:
        """Reclaim in batches sized to what the last batch managed in BATCH_S."""
        killers = self.manager.settings.gateway_reclaim_concurrency
        size, i = killers * FIRST_BATCH_PER_KILLER, 0
        while i < len(due):
            batch, t_batch = due[i : i + size], time.monotonic()
            await self._reclaim_batch(batch, now, killers, report)
            i += len(batch)
            rate = len(batch) / max(time.monotonic() - t_batch, 1e-3)
            size = int(min(LOCK_BATCH, max(killers, rate * BATCH_S)))

    async def _kill_orphans(
        self, orphans: list[tuple[ProviderSandbox, str, str]], report: PassReport
    ) -> None:
        for sbx, tenant_id, session_id in orphans:
            try:
                if await self._kill_orphan(sbx, tenant_id, session_id):
                    report.orphans_killed += 1
            except Exception:
                report.errors += 1
                log.exception("reclaimer could not handle sandbox %s", sbx.id)

    def _retentions(self) -> dict[str, float | None]:
        """Every tenant's retention, in one read (a policy that does not validate: None)."""
        out: dict[str, float | None] = {}
        for tenant in self.manager.store.tenants():
            try:
                out[tenant.id] = TenantPolicy.model_validate(tenant.policy or {}).retention_s
            except Exception:
                out[tenant.id] = None
        return out

    def _event(
        self,
        owner: SessionRow,
        sbx: ProviderSandbox,
        kind: str,
        at: float,
        reason: str,
        duration_ms: float | None = None,
    ) -> dict[str, Any]:
        """A timeline row (``Event`` columns; every event of a batch has the same keys)."""
        return {
            "at": at,
            "tenant_id": owner.tenant_id,
            "session_id": owner.session_id,
            "kind": kind,
            "replica": self.manager.replica,
            "sandbox_id": sbx.id,
            "duration_ms": duration_ms,
            "reason": reason,
            "provider_state": sbx.public(),
        }

    def _stop_event(self, owner: SessionRow, sbx: ProviderSandbox) -> dict[str, Any]:
        assert sbx.end_at is not None
        kind, reason = stop_event(sbx.failure)
        return self._event(owner, sbx, kind, sbx.end_at, reason)

    async def _reclaim_batch(
        self, batch: Sequence[_Due], now: float, killers: int, report: PassReport
    ) -> None:
        ttl = self.manager.settings.gateway_lock_ttl_s
        wanted = {d.owner.pk: d.sbx.id for d in batch}
        token, outcome = await self.manager.db(self.manager.store.lock_for_reclaim, wanted, ttl)
        start_by = time.monotonic() + ttl * LEASE_MARGIN
        locked = [d for d in batch if outcome[d.owner.pk] == "locked"]
        for o in outcome.values():
            if o == "busy":
                report.skipped_locked += 1  # a call is resuming or creating right now
            elif o == "in_use":
                report.skipped_in_use += 1
            elif o == "changed":
                report.skipped_changed += 1
        events: list[dict[str, Any]] = []
        reclaimed: list[int] = []

        async def one(d: _Due) -> None:
            if time.monotonic() > start_by:
                report.skipped_locked += 1  # our lease is running out: the next pass
                return
            try:
                duration_ms = await self._kill(d.sbx)
            except Exception:
                report.errors += 1
                log.exception("reclaimer could not kill sandbox %s", d.sbx.id)
                return
            if duration_ms is None:
                report.skipped_changed += 1
                return
            assert d.sbx.end_at is not None
            reclaimed.append(d.owner.pk)
            state = "failed" if d.sbx.failure else "paused"
            events.append(
                self._event(
                    d.owner,
                    d.sbx,
                    "sandbox_reclaimed",
                    time.time(),
                    f"{state} for {now - d.sbx.end_at:.1f} s >= retention {d.retention:g} s",
                    duration_ms,
                )
            )

        # ``killers`` workers taking the next kill from one iterator: at most that many in
        # flight, and a task per worker rather than per sandbox (10,000 tasks were a third of
        # a 10,000-sandbox pass).
        todo = iter(locked)

        async def worker() -> None:
            for d in todo:
                await one(d)

        pks = [d.owner.pk for d in locked]
        try:
            await asyncio.gather(*(worker() for _ in range(min(killers, len(locked)))))
        finally:
            report.reclaimed += len(reclaimed)
            try:
                store = self.manager.store
                cleared = await self.manager.db(store.finish_reclaim, token, pks, reclaimed, events)
                if cleared < len(reclaimed):
                    log.warning(
                        "lost the lock of %d sessions while reclaiming", len(reclaimed) - cleared
                    )
            except Exception:
                report.errors += 1
                log.exception("reclaimer could not record %d reclaims", len(reclaimed))
                await self.manager.db(self.manager.store.unlock_many, token, pks)

    async def _kill(self, sbx: ProviderSandbox) -> float | None:
        """Kill a sandbox due for reclaim (its session locked by us), if it is still paused with
        the endAt seen; the kill's duration (ms), or None when it changed meanwhile."""
        t0 = time.monotonic()
        if self.manager.provider.capabilities.conditional_delete:
            try:
                await self.manager.provider.kill(sbx.id, if_paused_end_at=sbx.end_at)
            except PreconditionFailed:
                return None
        else:
            current = await self.manager.provider.get(sbx.id)
            if current is not None and (current.state != "paused" or current.end_at != sbx.end_at):
                return None
            await self.manager.provider.kill(sbx.id)
        return round((time.monotonic() - t0) * 1000, 2)

    async def _kill_orphan(self, sbx: ProviderSandbox, tenant_id: str, session_id: str) -> bool:
        row = await self.manager.db(self.manager.store.get_session, tenant_id, session_id)
        token = None
        if row is not None:
            token = await self.manager.db(
                self.manager.store.try_lock, row.pk, self.manager.settings.gateway_lock_ttl_s
            )
            if token is None:
                return False  # its session is being changed: maybe this is being recorded now
        try:
            if row is not None:
                fresh = await self.manager.db(self.manager.store.session_by_pk, row.pk)
                if fresh is not None and fresh.sandbox_id == sbx.id:
                    return False  # recorded meanwhile: not an orphan
            killed = await self.manager.provider.kill(sbx.id)
            if killed:
                await self.manager.timeline.record(
                    tenant_id,
                    session_id,
                    "sandbox_orphan_killed",
                    sandbox_id=sbx.id,
                    reason="tagged sandbox that no session owns (its creator died)",
                    provider_state=sbx.public(),
                )
            return killed
        finally:
            if row is not None and token is not None:
                await self.manager.db(self.manager.store.unlock, row.pk, token)
