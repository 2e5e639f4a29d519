"""The base of the session manager: its plumbing, and creating (or adopting) a session's sandbox.

``SandboxSessionManager`` (sessions.py) is this plus the lease, resume, prepare, status and
close. A create happens only under the session's lease lock and only when the session has no
sandbox: a sandbox that a replica which died created but did not record is adopted instead,
and a create whose record is refused (the lock was lost) kills its own sandbox.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sandhold.config import Settings
from sandhold.errors import QuotaExceeded, SessionBusy
from sandhold.gateway.handles import HandleSealer
from sandhold.gateway.policy import TenantPolicy
from sandhold.gateway.providers.base import (
    CreateRequest,
    Provider,
    ProviderSandbox,
    SandboxGone,
)
from sandhold.gateway.timeline import Timeline
from sandhold.gateway.views import READ_ROOTS, WRITE_ROOTS, view_mounts
from sandhold.store.db import LockLost, SessionRow, Store

T = TypeVar("T")


class SessionsBase:
    settings: Settings
    store: Store
    provider: Provider
    timeline: Timeline
    handles: HandleSealer
    tag_session: str
    tag_tenant: str
    tag_gateway: str
    workspace_root: Path

    async def db(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    def gateway_tags(self) -> dict[str, str]:
        return {self.tag_gateway: self.settings.gateway_name}

    def workspace_dir(self, tenant_id: str, session_id: str) -> Path:
        return self.workspace_root / tenant_id / session_id

    def _opened(self, row: SessionRow) -> dict[str, Any]:
        return self.handles.unseal(row.sandbox_handle or {}, row.tenant_id, row.session_id)

    def _sealed(self, row: SessionRow, handle: dict[str, Any]) -> dict[str, Any]:
        return self.handles.seal(handle, row.tenant_id, row.session_id)

    async def _provider_create(
        self, row: SessionRow, policy: TenantPolicy, timeout: int, tags: dict[str, str]
    ) -> tuple[ProviderSandbox, dict[str, Any]]:
        # The view is checked against the host again: it may have changed since the policy was.
        views = await self.db(view_mounts, policy.skills, policy.references, self.settings)
        workspace = None
        if self.provider.capabilities.mount_workspace:
            workspace = self.workspace_dir(row.tenant_id, row.session_id)
            await self.db(_make_workspace, workspace)
        return await self.provider.create(
            CreateRequest(
                template=policy.template,
                timeout_s=timeout,
                metadata=tags,
                env=policy.env,
                workspace_dir=workspace,
                memory_mb=policy.memory_mb,
                cpu=policy.cpu,
                pids=policy.pids,
                views=[(v.source, v.target) for v in views],
                tenant=row.tenant_id,
                network=policy.network,
                file_view={"read": list(READ_ROOTS), "write": list(WRITE_ROOTS)},
                workspace_disk_mb=policy.workspace_disk_mb,
            )
        )

    async def _create(
        self, row: SessionRow, token: str, policy: TenantPolicy, timeout: int, cause: str
    ) -> tuple[str, dict[str, Any]]:
        tags = {
            **self.gateway_tags(),
            self.tag_tenant: row.tenant_id,
            self.tag_session: row.session_id,
        }
        # A sandbox created by a replica that died before recording it: adopt it rather than
        # create a second one for the session.
        existing = sorted(
            await self.provider.list(tags), key=lambda s: (s.state == "running", s.started_at)
        )
        if existing:
            keep = existing.pop()
            for extra in existing:
                await self.provider.kill(extra.id)
            try:
                await self.provider.connect(keep.id, timeout)
                # Created moments ago by a replica that read the same policy.
                handle = {"network": policy.network.model_dump()}
                if not await self.db(self.store.set_sandbox, row.pk, token, keep.id, handle):
                    raise SessionBusy("lost the session lock; retry")
                await self.timeline.record(
                    row.tenant_id,
                    row.session_id,
                    "sandbox_adopted",
                    sandbox_id=keep.id,
                    reason="found at the provider with the session's tags but not in the store",
                    provider_state=keep.public(),
                )
                return keep.id, handle
            except SandboxGone:
                pass
        quota, ttl = policy.max_live_sandboxes, self.settings.gateway_lock_ttl_s
        try:
            taken = await self.db(
                self.store.reserve_create, row.tenant_id, row.pk, token, quota, ttl
            )
        except LockLost:
            raise SessionBusy("lost the session lock; retry") from None
        if taken is not None:
            raise QuotaExceeded(
                f"tenant {row.tenant_id!r} already has {taken} live sandboxes or creates in "
                f"flight (max_live_sandboxes={policy.max_live_sandboxes}); close or wait for "
                "idle ones"
            )
        t0 = time.monotonic()
        try:
            sbx, handle = await self._provider_create(row, policy, timeout, tags)
        except BaseException:
            await self.db(self.store.set_sandbox, row.pk, token, None, None)  # free the slot
            raise
        handle = {**handle, "network": policy.network.model_dump()}
        if not await self.db(
            self.store.set_sandbox, row.pk, token, sbx.id, self._sealed(row, handle)
        ):
            # Our lease ran out mid-create and another replica may have acted: do not leak.
            await self.provider.kill(sbx.id)
            raise SessionBusy("lost the session lock while creating its sandbox; retry")
        await self.timeline.record(
            row.tenant_id,
            row.session_id,
            "sandbox_created",
            sandbox_id=sbx.id,
            duration_ms=ms_since(t0),
            reason=f"first {cause} of the session"
            if row.generation == 0
            else f"{cause} after the previous sandbox was reclaimed or lost (same workspace)",
            provider_state=sbx.public(),
        )
        return sbx.id, handle


def ms_since(t0: float) -> float:
    return round((time.monotonic() - t0) * 1000, 2)


def _make_workspace(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    traversable(path.parent)


def traversable(path: Path) -> None:
    """Sandboxes bind the workspace as an unprivileged user, which must traverse its parents."""
    mode = path.stat().st_mode
    if mode & 0o001 == 0:
        path.chmod(mode | 0o711)
