"""The gateway assembled: store, provider, session manager, reclaimer, deliverables, tools."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from sandhold.config import Settings
from sandhold.errors import Unauthenticated
from sandhold.gateway.deliverables import make_deliverables
from sandhold.gateway.policy import ID_RE, TenantPolicy, check_id
from sandhold.gateway.prom import GatewayMetrics
from sandhold.gateway.providers import make_provider
from sandhold.gateway.timeline import Timeline
from sandhold.gateway.views import view_mounts
from sandhold.store.db import Store
from sandhold.tunnel.tools import TunnelTools

log = logging.getLogger(__name__)


class Gateway:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store = Store(settings.gateway_store)
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

    @contextlib.asynccontextmanager
    async def running(self, reclaim: bool = True) -> AsyncIterator[Gateway]:
        await asyncio.to_thread(self.bootstrap)
        await self.manager.start()
        if reclaim:
            self.reclaimer.start(self.settings.gateway_reclaim_interval_s)
        try:
            yield self
        finally:
            await self.reclaimer.stop()
            await self.manager.stop()
            await self.provider.close()
            self.store.close()

    async def tenant_and_policy(self, api_key: str | None) -> tuple[str, TenantPolicy]:
        """The key's tenant and its policy, in one read of the store."""
        if api_key:
            tenant = await asyncio.to_thread(self.store.tenant_by_key, api_key)
            if tenant is not None:
                return tenant.id, TenantPolicy.model_validate(tenant.policy or {})
        raise Unauthenticated("missing or unknown API key (Authorization: Bearer <tenant key>)")

    async def tenant_of_key(self, api_key: str | None) -> str:
        if api_key:
            tenant = await asyncio.to_thread(self.store.tenant_by_key, api_key)
            if tenant is not None:
                return tenant.id
        raise Unauthenticated("missing or unknown API key (Authorization: Bearer <tenant key>)")
