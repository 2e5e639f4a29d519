"""Snapshots through the service: a team's own objects (another team's are "not found", as its
sandboxes are), taken of its sandboxes and started as new ones by naming them where a create
names a template (by id or by name)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandhold.errors import TemplateNotFound
from sandhold.runtime.records import SandboxInfo
from sandhold.runtime.snapshots import ID_PREFIX, Mode, Snapshot, SnapshotStore
from sandhold.runtime.spec import SandboxSpec

if TYPE_CHECKING:
    from sandhold.service.service import SandboxService


def _store(service: SandboxService) -> SnapshotStore:
    return SnapshotStore(service.runtime)


async def take(service: SandboxService, owner: str, sandbox_id: str, name: str | None,
               memory: bool | None) -> Snapshot:  # fmt: skip
    mode: Mode = "filesystem" if memory is False else "full"
    async with service.lock(sandbox_id):
        sbx = await service.usable(owner, sandbox_id)
        return await service._run(_store(service).take, sbx.id, owner, name, mode)


async def listed(service: SandboxService, owner: str, sandbox_id: str | None = None,
                 name: str | None = None) -> list[Snapshot]:  # fmt: skip
    snaps = await service._run(_store(service).list)
    return [s for s in snaps if s.owner == owner
            and (sandbox_id is None or s.source == sandbox_id)
            and (name is None or name == s.id or name in s.names)]  # fmt: skip


async def find(service: SandboxService, owner: str, ref: str) -> Snapshot | None:
    """The owner's snapshot ``ref`` names (its id or one of its names), if any."""
    if ref.startswith(ID_PREFIX):
        try:
            snap = await service._run(_store(service).get, ref)
        except TemplateNotFound:
            return None
        return snap if snap.owner == owner else None
    named = await listed(service, owner, name=ref)
    return named[-1] if named else None  # the newest of that name


async def delete(service: SandboxService, owner: str, ref: str) -> None:
    snap = await find(service, owner, ref)
    if snap is None:
        raise TemplateNotFound(f"snapshot {ref!r} does not exist")
    await service._run(_store(service).delete, snap.id)


async def start(service: SandboxService, snap: Snapshot, spec: SandboxSpec,
                extra: dict[str, object]) -> SandboxInfo:  # fmt: skip
    """A sandbox from ``snap``. A filesystem snapshot boots with the create's spec (its
    network policy, env, limits) over the saved files and the snapshot's template; a full one
    keeps what its memory was made with."""
    fresh = spec.model_copy(update={"template": snap.template, "limits": spec.limits.model_copy(
        update={"disk_mb": SandboxSpec.model_validate(snap.spec, context={"stored": True})
                .limits.disk_mb})})  # fmt: skip
    return await service._run(_store(service).start, snap, extra, fresh)
