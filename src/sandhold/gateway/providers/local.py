"""The ``local`` provider: the sandbox service in this process.

Timeouts, auto-pause, connect and metadata mean exactly what they mean behind ``sandhold serve``
(it is the same service); only the HTTP hop is gone. Requests are the service's own types: host
mounts, the file view and the tenant's egress go in as fields, nothing through metadata. The
data plane is the agent's unix socket (envd), and its CONNECT tunnel for other ports.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from sandhold.config import Settings
from sandhold.egress.policy import EgressPolicy
from sandhold.envd.transports import agent_channel
from sandhold.errors import Conflict, NeedsNewSandbox, SandboxGone, SandboxNotFound
from sandhold.gateway.providers.base import (
    Capabilities,
    Channel,
    CreateRequest,
    Provider,
    ProviderSandbox,
)
from sandhold.runtime.runtime import Runtime
from sandhold.runtime.spec import NetworkPolicy
from sandhold.service import CreateSandbox, Mount, Sandbox, SandboxService

OWNER = "gateway"


def _listed(sbx: Sandbox) -> ProviderSandbox:
    return ProviderSandbox(
        id=sbx.id,
        state=sbx.state,  # failed is paused for good: connect and channel say SandboxGone
        end_at=sbx.end_at,
        started_at=sbx.info.created_at,
        metadata=dict(sbx.metadata),
        failure=(sbx.info.failure or "its agent died") if sbx.failed else None,
        suspended=sbx.info.suspended == "disk" and not sbx.failed,
    )


def _gone(sandbox_id: str) -> SandboxGone:
    return SandboxGone(f"sandbox {sandbox_id} no longer exists", sandbox_id)


class LocalProvider(Provider):
    name = "local"
    capabilities = Capabilities(
        pause_keeps_memory=True,  # the cgroup freezer keeps every process as it was
        suspends_to_disk=False,  # until start(): whether CRIU is usable here
        snapshots=False,  # not built yet
        fork=False,  # not built yet
        auto_resume=True,
        mount_workspace=True,
        conditional_delete=True,
        idle_timeout=False,
        per_sandbox_limits=True,
    )

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.runtime = Runtime(settings)
        self.service = SandboxService(self.runtime, settings)

    async def start(self) -> None:
        await self.service.open()
        suspends = await self.service.suspends_to_disk()
        self.capabilities = replace(self.capabilities, suspends_to_disk=suspends)

    async def close(self) -> None:
        await self.service.close()

    async def create(self, req: CreateRequest) -> tuple[ProviderSandbox, dict[str, Any]]:
        sbx = await self.service.create(
            CreateSandbox(
                owner=OWNER,
                template=req.template,
                timeout_s=req.timeout_s,
                on_timeout="pause",
                auto_resume=True,
                memory_mb=req.memory_mb,
                cpu=req.cpu,
                pids=req.pids,
                env=req.env,
                metadata=req.metadata,
                workspace_dir=req.workspace_dir,
                workspace_disk_mb=req.workspace_disk_mb,
                mounts=[Mount(src, dst, read_only=True) for src, dst in req.views],
                file_view=req.file_view or {},
                network=_network(req.tenant, req.network),
            )
        )
        return _listed(sbx), {}

    async def connect(self, sandbox_id: str, timeout_s: int) -> tuple[bool, dict[str, Any]]:
        try:
            _sbx, resumed = await self.service.connect(OWNER, sandbox_id, timeout_s)
        except SandboxNotFound:
            raise _gone(sandbox_id) from None
        return resumed, {}

    async def set_timeout(self, sandbox_id: str, timeout_s: int) -> None:
        with contextlib.suppress(SandboxNotFound):
            await self.service.set_timeout(OWNER, sandbox_id, timeout_s)

    async def update_network(self, sandbox_id: str, tenant: str, network: EgressPolicy) -> None:
        try:
            await self.service.set_network(OWNER, sandbox_id, _network(tenant, network))
        except SandboxNotFound:
            raise _gone(sandbox_id) from None
        except Conflict as e:  # egress cannot be added to (or removed from) a live sandbox
            raise NeedsNewSandbox(e.message) from None

    async def get(self, sandbox_id: str) -> ProviderSandbox | None:
        sbx = await self.service.get(sandbox_id)
        return _listed(sbx) if sbx is not None and sbx.owner == OWNER else None

    async def list(self, metadata: dict[str, str]) -> list[ProviderSandbox]:
        return [_listed(s) for s in await self.service.query(OWNER, metadata=metadata)]

    async def kill(self, sandbox_id: str, if_paused_end_at: float | None = None) -> bool:
        cond: dict[str, Any] = {}
        if if_paused_end_at is not None:
            cond = {"if_state": "paused", "if_end_at": if_paused_end_at}
        try:
            await self.service.kill(OWNER, sandbox_id, **cond)
        except SandboxNotFound:
            return False
        return True

    @contextlib.asynccontextmanager
    async def channel(
        self, sandbox_id: str, handle: dict[str, Any], port: int
    ) -> AsyncIterator[Channel]:
        sbx = await self.service.get(sandbox_id)
        if sbx is not None and not sbx.running:  # traffic resumes it, as on the E2B surface
            sbx = await self.service.auto_resume(sandbox_id)
        if sbx is None or sbx.owner != OWNER:
            raise _gone(sandbox_id)
        async with agent_channel(sbx.info.agent_socket, port) as ch:
            yield ch


def _network(tenant: str, network: EgressPolicy) -> NetworkPolicy:
    """The tenant's egress, with the tenant's secrets (sandboxes all belong to OWNER here)."""
    return NetworkPolicy(**network.model_dump(), tenant=tenant)
