"""Snapshots through the service: a team's own objects (another team's are "not found", as its
sandboxes are), taken of its sandboxes and started as new ones by naming them where a create
names a template (by id or by name)."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Protocol

from sandhold.errors import TemplateNotFound
from sandhold.runtime.checkpoint.snapshots import ID_PREFIX, Mode, Snapshot, SnapshotStore
from sandhold.runtime.records import SandboxInfo
from sandhold.runtime.runtime import Runtime
from sandhold.runtime.spec import SandboxSpec
from sandhold.service.offload import Offload
from sandhold.service.records import Sandbox


class ServiceParts(Protocol):
    """What snapshots use of the service (``SandboxService`` has it all)."""

    runtime: Runtime
    offload: Offload

    def lock(self, sandbox_id: str) -> AbstractAsyncContextManager[None]: ...

    async def usable(self, owner: str, sandbox_id: str) -> Sandbox: ...


def _store(service: ServiceParts) -> SnapshotStore:
    return SnapshotStore(service.runtime)


async def take(
    service: ServiceParts, owner: str, sandbox_id: str, name: str | None, memory: bool | None
) -> Snapshot:
    mode: Mode = "filesystem" if memory is False else "full"
    async with service.lock(sandbox_id):
        sbx = await service.usable(owner, sandbox_id)
        return await service.offload.run(_store(service).take, sbx.id, owner, name, mode)


async def listed(
    service: ServiceParts, owner: str, sandbox_id: str | None = None, name: str | None = None
) -> list[Snapshot]:
    snaps = await service.offload.run(_store(service).list)
    return [
        s
        for s in snaps
        if s.owner == owner
        and (sandbox_id is None or s.source == sandbox_id)
        and (name is None or name == s.id or name in s.names)
    ]


async def find(service: ServiceParts, owner: str, ref: str) -> Snapshot | None:
    """The owner's snapshot ``ref`` names (its id or one of its names), if any."""
    if ref.startswith(ID_PREFIX):
        try:
            snap = await service.offload.run(_store(service).get, ref)
        except TemplateNotFound:
            return None
        return snap if snap.owner == owner else None
    named = await listed(service, owner, name=ref)
    return named[-1] if named else None  # the newest of that name


async def delete(service: ServiceParts, owner: str, ref: str) -> None:
    snap = await find(service, owner, ref)
    if snap is None:
        raise TemplateNotFound(f"snapshot {ref!r} does not exist")
    await service.offload.run(_store(service).delete, snap.id)


async def start(
    service: ServiceParts,
    snap: Snapshot,
    spec: SandboxSpec,
    extra: dict[str, object],
    sandbox_id: str | None = None,
) -> SandboxInfo:
    """A sandbox from ``snap``. A filesystem snapshot boots with the create's spec (its
    network policy, env, limits) over the saved files and the snapshot's template; a full one
    keeps what its memory was made with."""
    fresh = spec.model_copy(
        update={
            "template": snap.template,
            "limits": spec.limits.model_copy(
                update={
                    "disk_mb": SandboxSpec.model_validate(
                        snap.spec, context={"stored": True}
                    ).limits.disk_mb
                }
            ),
        }
    )
    return await service.offload.run(_store(service).start, snap, extra, fresh, sandbox_id)
