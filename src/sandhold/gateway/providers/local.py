"""The ``local`` provider: the sandbox service in this process.

Timeouts, auto-pause, connect and metadata mean exactly what they mean behind ``sandhold serve``
(it is the same service); only the HTTP hop is gone. Requests are the service's own types: host
mounts, the file view and the tenant's egress go in as fields, nothing through metadata. The
data plane is the agent's unix socket (envd), and its CONNECT tunnel for other ports, through one
pooled client per sandbox and port (``channels.py``).

A sandbox this provider created, connected or timed out is known to be running until the end
it set (``known_running_for``): the service pauses a running sandbox only once its end has
passed, and only this provider (the owner ``gateway``) moves that end. The session manager
then skips its status read before ``connect`` (and the connect, when that end outlasts the
call), and ``channel`` its read before connecting. The hint is the service's own state as its
only writer last set it, never a decision of the gateway's: ``connect`` still says whether it
resumed, and a gone agent still fails the call.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from sandhold.config import Settings
from sandhold.egress.policy import EgressPolicy
from sandhold.errors import Conflict, NeedsNewSandbox, SandboxGone, SandboxNotFound
from sandhold.gateway.providers.base import (
    Capabilities,
    Channel,
    CreateRequest,
    Provider,
    ProviderSandbox,
)
from sandhold.gateway.providers.channels import Channels
from sandhold.runtime.runtime import Runtime
from sandhold.runtime.spec import NetworkPolicy
from sandhold.service import CreateSandbox, Mount, Sandbox, SandboxService

OWNER = "gateway"
# A sandbox counts as running until this long before the end this provider set: the service
# takes the end from its own clock a moment after ours.
HINT_MARGIN_S = 0.25


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
        self.channels = Channels()
        # sandbox id -> (wall-clock time until which it surely runs, its agent's socket)
        self._running: dict[str, tuple[float, Path]] = {}

    def known_running_for(self, sandbox_id: str) -> float:
        seen = self._running.get(sandbox_id)
        return 0.0 if seen is None else max(0.0, seen[0] - time.time())

    def _runs(self, sbx: Sandbox, timeout_s: int, t0: float) -> None:
        """``sbx`` runs until ``t0 + timeout_s`` at least (``t0``: before the service was asked)."""
        if len(self._running) > 4096:  # sandboxes paused or gone by other paths: forget them
            now = time.time()
            self._running = {k: v for k, v in self._running.items() if v[0] > now}
        self._running[sbx.id] = (t0 + timeout_s - HINT_MARGIN_S, sbx.info.agent_socket)

    async def _forget(self, sandbox_id: str) -> None:
        self._running.pop(sandbox_id, None)
        await self.channels.drop(sandbox_id)

    async def start(self) -> None:
        await self.service.open()
        suspends = await self.service.suspends_to_disk()
        self.capabilities = replace(self.capabilities, suspends_to_disk=suspends)

    async def close(self) -> None:
        await self.channels.close()
        await self.service.close()

    async def create(self, req: CreateRequest) -> tuple[ProviderSandbox, dict[str, Any]]:
        t0 = time.time()
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
        self._runs(sbx, req.timeout_s, t0)
        return _listed(sbx), {}

    async def connect(self, sandbox_id: str, timeout_s: int) -> tuple[bool, dict[str, Any]]:
        t0 = time.time()
        try:
            sbx, resumed = await self.service.connect(OWNER, sandbox_id, timeout_s)
        except SandboxNotFound:
            await self._forget(sandbox_id)
            raise _gone(sandbox_id) from None
        self._runs(sbx, timeout_s, t0)
        return resumed, {}

    async def set_timeout(self, sandbox_id: str, timeout_s: int) -> None:
        t0 = time.time()
        seen = self._running.pop(sandbox_id, None)  # no hint while its end changes
        try:
            await self.service.set_timeout(OWNER, sandbox_id, timeout_s)
        except SandboxNotFound:
            return  # gone, or paused: nothing runs
        if seen is not None:
            self._running[sandbox_id] = (t0 + timeout_s - HINT_MARGIN_S, seen[1])

    async def update_network(self, sandbox_id: str, tenant: str, network: EgressPolicy) -> None:
        try:
            await self.service.set_network(OWNER, sandbox_id, _network(tenant, network))
        except SandboxNotFound:
            raise _gone(sandbox_id) from None
        except Conflict as e:  # egress cannot be added to (or removed from) a live sandbox
            raise NeedsNewSandbox(e.message) from None

    async def get(self, sandbox_id: str) -> ProviderSandbox | None:
        sbx = await self.service.get(sandbox_id)
        if sbx is None or sbx.owner != OWNER:
            return None
        if not sbx.running:
            self._running.pop(sandbox_id, None)
        return _listed(sbx)

    async def list(self, metadata: dict[str, str]) -> list[ProviderSandbox]:
        return [_listed(s) for s in await self.service.query(OWNER, metadata=metadata)]

    async def kill(self, sandbox_id: str, if_paused_end_at: float | None = None) -> bool:
        cond: dict[str, Any] = {}
        if if_paused_end_at is not None:
            cond = {"if_state": "paused", "if_end_at": if_paused_end_at}
        try:
            await self.service.kill(OWNER, sandbox_id, **cond)
        except SandboxNotFound:
            await self._forget(sandbox_id)
            return False
        await self._forget(sandbox_id)  # not when a condition refused it: it may be in use
        return True

    @contextlib.asynccontextmanager
    async def channel(
        self, sandbox_id: str, handle: dict[str, Any], port: int
    ) -> AsyncIterator[Channel]:
        seen = self._running.get(sandbox_id)
        if seen is not None and time.time() < seen[0]:
            socket_path = seen[1]
        else:
            sbx = await self.service.get(sandbox_id)
            if sbx is not None and not sbx.running:  # traffic resumes it, as on the E2B surface
                sbx = await self.service.auto_resume(sandbox_id)
            if sbx is None or sbx.owner != OWNER:
                raise _gone(sandbox_id)
            socket_path = sbx.info.agent_socket
        try:
            with self.channels.get(sandbox_id, socket_path, port) as ch:
                yield ch
        except SandboxGone:
            await self._forget(sandbox_id)  # its agent is gone: the next call reads its state
            raise
        except httpx.TransportError:
            # Cut off mid-request (its agent may have just died): the next call reads its state.
            self._running.pop(sandbox_id, None)
            raise


def _network(tenant: str, network: EgressPolicy) -> NetworkPolicy:
    """The tenant's egress, with the tenant's secrets (sandboxes all belong to OWNER here)."""
    return NetworkPolicy(**network.model_dump(), tenant=tenant)
