"""The ``local`` provider: the runtime in this process.

It reuses the E2B server's view of the runtime (``sandhold.e2b.sandboxes.Sandboxes``) and its
timer (``Lifecycle``), so timeouts, auto-pause, connect and metadata mean exactly what they mean
behind ``sandhold serve``; only the HTTP hop is gone. The data plane is the agent's unix socket
(envd), and its CONNECT tunnel for other ports (the code interpreter's 49999).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpcore
import httpx

from sandhold.config import Settings
from sandhold.e2b.errors import ApiError
from sandhold.e2b.lifecycle import Lifecycle
from sandhold.e2b.models import AutoResume, NewSandbox
from sandhold.e2b.sandboxes import FILE_VIEW_KEY, HOST_MOUNT_KEY, Sandbox, Sandboxes
from sandhold.e2b.volumes import VolumeStore
from sandhold.egress.policy import EgressPolicy
from sandhold.gateway.providers.base import (
    Capabilities,
    Channel,
    CreateRequest,
    NeedsNewSandbox,
    PreconditionFailed,
    Provider,
    ProviderError,
    ProviderSandbox,
    SandboxGone,
)
from sandhold.runtime.runtime import Runtime
from sandhold.runtime.spec import NetworkPolicy

ENVD_PORT = 49983
TEAM = "gateway"


class TunnelBackend(httpcore.AsyncNetworkBackend):
    """Every "TCP connection" is a CONNECT tunnel through the agent's socket to a port inside
    the sandbox's network namespace."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self.inner.connect_unix_socket(self.socket_path, timeout)
        await stream.write(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:  # the agent sends nothing after its answer's head
            chunk = await stream.read(1, timeout)
            if not chunk or len(head) > 4096:
                await stream.aclose()
                raise httpcore.ConnectError(f"the sandbox closed the tunnel to port {port}")
            head += chunk
        if head.split(b" ", 2)[1:2] != [b"200"]:
            await stream.aclose()
            raise httpcore.ConnectError(f"port {port} is not open in the sandbox")
        return stream

    async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        raise NotImplementedError

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


class TunnelTransport(httpx.AsyncHTTPTransport):
    def __init__(self, socket_path: str) -> None:
        super().__init__(verify=False)  # plain HTTP inside the tunnel (see channel())
        self._pool = httpcore.AsyncConnectionPool(network_backend=TunnelBackend(socket_path))


def _listed(sbx: Sandbox) -> ProviderSandbox:
    return ProviderSandbox(
        id=sbx.id,
        state=sbx.info.state,
        end_at=sbx.end_at,
        started_at=sbx.info.created_at,
        metadata=dict(sbx.info.metadata),
    )


def _error(e: ApiError, sandbox_id: str | None = None) -> ProviderError:
    if e.status == 404 and sandbox_id:
        return SandboxGone(f"sandbox {sandbox_id} no longer exists")
    return ProviderError(f"local provider: {e.message}")


class LocalProvider(Provider):
    name = "local"
    capabilities = Capabilities(
        pause_keeps_memory=True,  # the cgroup freezer keeps every process as it was
        auto_resume=True,
        mount_workspace=True,
        conditional_delete=True,
        idle_timeout=False,
        per_sandbox_limits=True,
    )

    def __init__(self, settings: Settings) -> None:
        roots = [*settings.host_mount_roots, settings.gateway_workspace_root_path,
                 *settings.gateway_view_roots]  # fmt: skip
        self.settings = settings.model_copy(update={"host_mount_roots": roots})
        self.runtime = Runtime(self.settings)
        self.sandboxes = Sandboxes(self.runtime, self.settings, VolumeStore(self.settings))
        self.lifecycle = Lifecycle(self.sandboxes, self.settings.lifecycle_interval_s)

    async def start(self) -> None:
        await self.sandboxes.off_loop(_warm(self.runtime))
        self.lifecycle.start()

    async def close(self) -> None:
        await self.lifecycle.stop()
        await self.sandboxes.drain()

    async def create(self, req: CreateRequest) -> tuple[ProviderSandbox, dict[str, Any]]:
        metadata = dict(req.metadata)
        binds = [{"hostPath": str(src), "mountPath": dst, "readOnly": True}
                 for src, dst in req.views]  # fmt: skip
        if req.workspace_dir is not None:
            binds.insert(0, {"hostPath": str(req.workspace_dir), "mountPath": "/workspace"})
        if binds:
            metadata[HOST_MOUNT_KEY] = json.dumps(binds)
        if req.file_view is not None:
            metadata[FILE_VIEW_KEY] = json.dumps(req.file_view)
        body = NewSandbox(
            templateID=req.template,
            timeout=req.timeout_s,
            autoPause=True,
            autoResume=AutoResume(enabled=True),
            metadata=metadata,
            envVars=req.env,
        )
        limits = {"memory_mb": req.memory_mb, "cpu": req.cpu, "pids": req.pids}
        try:
            sbx = await self.sandboxes.create(
                TEAM, body, v1=False, idempotency_key=None, limits=limits,
                network=_network(req.tenant, req.network),
            )  # fmt: skip
        except ApiError as e:
            raise _error(e) from None
        return _listed(sbx), {}

    async def connect(self, sandbox_id: str, timeout_s: int) -> tuple[bool, dict[str, Any]]:
        try:
            _sbx, resumed = await self.sandboxes.connect(TEAM, sandbox_id, timeout_s, None)
        except ApiError as e:
            raise _error(e, sandbox_id) from None
        return resumed, {}

    async def set_timeout(self, sandbox_id: str, timeout_s: int) -> None:
        try:
            await self.sandboxes.set_timeout(TEAM, sandbox_id, timeout_s)
        except ApiError as e:
            if e.status != 404:
                raise _error(e, sandbox_id) from None

    async def update_network(self, sandbox_id: str, tenant: str, network: EgressPolicy) -> None:
        try:
            await self.sandboxes.set_network(TEAM, sandbox_id, _network(tenant, network))
        except ApiError as e:
            if e.status == 409:
                raise NeedsNewSandbox(e.message) from None
            raise _error(e, sandbox_id) from None

    async def get(self, sandbox_id: str) -> ProviderSandbox | None:
        sbx = self.sandboxes.get(sandbox_id)
        return _listed(sbx) if sbx is not None and sbx.st.team == TEAM else None

    async def list(self, metadata: dict[str, str]) -> list[ProviderSandbox]:
        return [
            _listed(s)
            for s in self.sandboxes.all()
            if s.st.team == TEAM and all(s.info.metadata.get(k) == v for k, v in metadata.items())
        ]

    async def kill(self, sandbox_id: str, if_paused_end_at: float | None = None) -> bool:
        cond = {} if if_paused_end_at is None else {"if_state": "paused",
                                                    "if_end_at": if_paused_end_at}  # fmt: skip
        try:
            await self.sandboxes.kill(TEAM, sandbox_id, **cond)  # type: ignore[arg-type]
        except ApiError as e:
            if e.status == 404:
                return False
            if e.status == 412:
                raise PreconditionFailed(e.message) from None
            raise _error(e, sandbox_id) from None
        return True

    @contextlib.asynccontextmanager
    async def channel(
        self, sandbox_id: str, handle: dict[str, Any], port: int
    ) -> AsyncIterator[Channel]:
        sbx = self.sandboxes.get(sandbox_id)
        if sbx is None:
            raise SandboxGone(f"sandbox {sandbox_id} no longer exists")
        sock = str(sbx.info.agent_socket)
        transport: httpx.AsyncBaseTransport
        # No TLS on a unix socket: verify=False spares building a default SSL context (loading
        # the CA bundle), which took ~26 ms per channel, i.e. per tool call.
        if port == ENVD_PORT:
            transport = httpx.AsyncHTTPTransport(uds=sock, verify=False)
        else:
            transport = TunnelTransport(sock)
        async with httpx.AsyncClient(transport=transport, timeout=None) as client:
            yield Channel(client, f"http://127.0.0.1:{port}", {})


def _network(tenant: str, network: EgressPolicy) -> NetworkPolicy:
    """The tenant's egress, with the tenant's secrets (sandboxes all belong to TEAM here)."""
    return NetworkPolicy(**network.model_dump(), tenant=tenant)


async def _warm(runtime: Runtime) -> None:
    """Build ``base`` and the agent's library copy once, before concurrent creates would."""
    runtime.templates.get("base")
    runtime.agent_lib()
