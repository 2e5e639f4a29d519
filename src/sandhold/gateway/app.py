"""The gateway assembled: store, provider, session manager, reclaimer, deliverables, tools."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from sandhold.config import Settings
from sandhold.errors import Unauthenticated
from sandhold.gateway.deliverables import make_deliverables
from sandhold.gateway.keys import TenantKeys
from sandhold.gateway.policy import ID_RE, TenantPolicy, check_id
from sandhold.gateway.prom import GatewayMetrics
from sandhold.gateway.providers import make_provider
from sandhold.gateway.timeline import Timeline
from sandhold.gateway.views import view_mounts
from sandhold.service.timers import Periodic
from sandhold.store.db import Store
from sandhold.store.rollups import roll_up
from sandhold.tunnel.tools import TunnelTools

log = logging.getLogger(__name__)


class Gateway:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store = Store(settings.gateway_store)
        self.keys = TenantKeys(self.store, settings.gateway_auth_cache_ttl_s)
        self.provider = make_provider(settings)
        self.deliverables = make_deliverables(settings)
        replica = settings.gateway_replica_id
        # The metered parts when gateway_metrics is on (gateway/prom.py), else the plain ones.
        m = self.metrics = GatewayMetrics(settings, self.store)
        self.manager = m.manager(
            settings, self.store, self.provider, Timeline(self.store, replica or "")
        )
        self.timeline = m.timeline(self.store, self.manager.replica)
        self.manager.timeline = self.timeline
        self.reclaimer = m.reclaimer(self.manager)
        self.tools = m.tools(self.manager, self.deliverables, self.timeline)
        self.tunnels = TunnelTools(settings, self.store, self.timeline, self.manager.replica)
        self.rollups = Periodic(
            self.roll_up, settings.gateway_rollup_interval_s, "gateway rollup", at_start=True
        )

    def bootstrap(self) -> None:
        """Schema migrations, then the tenants of the configuration (validated first)."""
        if self.settings.gateway_store_url is None:
            self.settings.data_dir.joinpath("gateway").mkdir(parents=True, exist_ok=True)
        self.store.migrate()
        for tenant_id, spec in self.settings.gateway_tenants.items():
            check_id(tenant_id, "tenant id", ID_RE)
            policy = TenantPolicy.model_validate(spec.get("policy") or {})
            view_mounts(policy.skills, policy.references, self.settings)
            self.store.put_tenant(tenant_id, policy.model_dump(), spec.get("api_key"))
        self.keys.forget()

    @contextlib.asynccontextmanager
    async def running(self, reclaim: bool = True) -> AsyncIterator[Gateway]:
        """The gateway started; with ``reclaim``, its background jobs too (the reclaimer and
        the timeline's rollups), as a server runs them and a one-off command does not."""
        await asyncio.to_thread(self.bootstrap)
        await self.manager.start()
        if reclaim:
            self.reclaimer.start(self.settings.gateway_reclaim_interval_s)
            self.rollups.start()
        try:
            yield self
        finally:
            await self.rollups.stop()
            await self.reclaimer.stop()
            await self.manager.stop()
            await self.provider.close()
            self.store.close()

    async def roll_up(self) -> int:
        """Roll up the timeline's hours that are due (store/rollups.py), a few per trip to a
        worker thread; a stop waits for the trip under way (the store closes after it)."""
        done = 0
        while True:
            trip = asyncio.ensure_future(
                asyncio.to_thread(
                    roll_up, self.store.engine, self.settings.gateway_rollup_lag_s, None, 6
                )
            )
            try:
                n = await asyncio.shield(trip)
            except asyncio.CancelledError:
                await trip
                raise
            if not n:
                break
            done += n
        if done:
            log.info("rolled up %d hour(s) of the timeline", done)
        return done

    async def tenant_and_policy(self, api_key: str | None) -> tuple[str, TenantPolicy]:
        """The key's tenant and its policy: one read of the store, or none while this replica
        read them less than ``gateway_auth_cache_ttl_s`` ago (gateway/keys.py)."""
        if api_key:
            found = await self.keys.lookup(api_key)
            if found is not None:
                return found
        raise Unauthenticated("missing or unknown API key (Authorization: Bearer <tenant key>)")

    async def tenant_of_key(self, api_key: str | None) -> str:
        return (await self.tenant_and_policy(api_key))[0]

    async def put_tenant(self, tenant_id: str, policy: TenantPolicy, api_key: str | None) -> None:
        """Write a tenant (its policy; its key when given); this replica's key cache forgets
        what it held, so the change applies here from the next request."""
        try:
            await asyncio.to_thread(self.store.put_tenant, tenant_id, policy.model_dump(), api_key)
        finally:
            self.keys.forget()
