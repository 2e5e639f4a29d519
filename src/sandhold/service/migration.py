"""A paused sandbox kept in the fleet's shared store, taken up again by any host (docs/fleet.md).

- **Store** (``store``): a paused sandbox is suspended to disk if it is not yet, then its memory
  image (``checkpoint/``) and its layer image (``disk.img``) are uploaded, sealed, with its record
  (spec, template, ``extra``: tokens, lifecycle, generation) under ``<snapshot_s3_prefix>fleet/``,
  as ``<id>.g<generation>``: whether a generation is kept there is one HEAD request (a host
  answers an edge's ``/fleet/stored``), without the key ring. The host's own copy stays: a
  restart in place resumes it without the store. A fleet host stores a paused sandbox
  ``fleet_store_after_s`` after its pause, and every sandbox when it drains (fleet_jobs.py).
- **Adopt** (``adopt``): a host given the sandbox at a newer generation resumes its own suspended
  copy if it has one, else fetches the stored one and restores it under the same id, tokens and
  lifecycle, in a uid range of this host (``fork.start``, as a fork restores).
"""

from __future__ import annotations

import logging
import os
import secrets
from typing import TYPE_CHECKING, Any

from sandhold.errors import CheckpointFailed, Conflict, SandboxNotFound, Unavailable
from sandhold.runtime import disk, safefs
from sandhold.runtime.checkpoint import fork, process_tree
from sandhold.runtime.checkpoint.snapshot_remote import S3Remote
from sandhold.runtime.spec import SandboxSpec
from sandhold.service.fleet import KEY, generation_of
from sandhold.service.fleet import of as fleet_of

if TYPE_CHECKING:
    from sandhold.config import Settings
    from sandhold.runtime.records import SandboxInfo
    from sandhold.runtime.runtime import Runtime

log = logging.getLogger(__name__)

PREFIX = "fleet/"


def remote(settings: Settings) -> S3Remote | None:
    """The store's part for sandboxes in transit, or None without a store."""
    if not settings.snapshot_s3_bucket:
        return None
    return S3Remote(settings.model_copy(update={"snapshot_s3_prefix": _prefix(settings)}))


def _prefix(settings: Settings) -> str:
    return settings.snapshot_s3_prefix + PREFIX


def object_name(sandbox_id: str, generation: int) -> str:
    return f"{sandbox_id}.g{generation}"


def stored_generation(info: SandboxInfo) -> int | None:
    """The generation of the sandbox's copy in the store (None: none there)."""
    stored = fleet_of(info.extra).get("stored")
    return int(stored) if stored is not None else None


def store(runtime: Runtime, store: S3Remote, sandbox_id: str) -> SandboxInfo:
    """Suspend a paused sandbox to disk (if it is not yet) and upload it; blocking (called on a
    worker thread, under the service's lock of the sandbox)."""
    info = runtime.get(sandbox_id)
    if info.state != "paused":
        raise Conflict(f"sandbox {sandbox_id} is not paused")
    if info.suspended == "filesystem":
        raise Conflict(f"sandbox {sandbox_id} was paused without its memory: nothing to store")
    if not info.suspended:
        info = runtime.suspend(sandbox_id)
    generation = generation_of(info.extra)
    staging = info.dir.parent.parent / "fleet-out" / f"{sandbox_id}-{secrets.token_hex(4)}"
    (staging / process_tree.IMAGES).mkdir(parents=True, mode=0o700)
    try:
        for f in (info.dir / process_tree.IMAGES).iterdir():  # links: nothing copied
            os.link(f, staging / process_tree.IMAGES / f.name)
        os.link(info.dir / disk.IMAGE, staging / disk.IMAGE)
        meta = {
            "id": object_name(sandbox_id, generation),
            "sandbox": sandbox_id,
            "template": info.template,
            "spec": info.spec.model_dump(mode="json"),
            "extra": info.extra,
            "created_at": info.created_at,
            "paused_at": info.paused_at,
        }
        store.put(meta, staging)
    finally:
        safefs.remove_quietly(staging)
    fleet = {**fleet_of(info.extra), "stored": generation}
    return runtime.update_extra(sandbox_id, **{KEY: fleet})


def adopt(
    runtime: Runtime, store: S3Remote | None, sandbox_id: str, generation: int, from_generation: int
) -> SandboxInfo:
    """Take up the sandbox at ``generation``: this host's own suspended copy, else the stored
    copy of ``from_generation``. Returns it paused (a fetched copy is restored, then frozen:
    the caller's connect or resume thaws it)."""
    try:
        own = runtime.get(sandbox_id)
    except SandboxNotFound:
        own = None
    if own is not None:
        if generation_of(own.extra) >= generation:
            raise Conflict(f"sandbox {sandbox_id} is here at generation {generation_of(own.extra)}")
        fleet = {**fleet_of(own.extra), "generation": generation}
        fleet.pop("resume_on_call", None)
        return runtime.update_extra(sandbox_id, **{KEY: fleet})
    if store is None:
        raise Unavailable("this host has no shared store (snapshot_s3_bucket) to adopt from")
    staging = (
        runtime.host.sandboxes_dir.parent / "fleet-in" / f"{sandbox_id}-{secrets.token_hex(4)}"
    )
    staging.mkdir(parents=True, mode=0o700)
    try:
        meta = store.fetch(object_name(sandbox_id, from_generation), staging)
        if meta.get("sandbox") != sandbox_id:
            raise CheckpointFailed(f"the store's copy of {sandbox_id} names another sandbox")
        extra: dict[str, Any] = dict(meta["extra"])
        extra[KEY] = {"generation": generation, "stored": from_generation}
        spec = SandboxSpec.model_validate(meta["spec"], context={"stored": True})
        info = fork.start(
            runtime.host, spec, str(meta["template"]), staging, extra, "migrated", None, sandbox_id
        )
    finally:
        safefs.remove_quietly(staging)
    info.created_at = float(meta.get("created_at") or info.created_at)  # its life goes on
    runtime.host.records.save(info)
    return runtime.pause(sandbox_id)


def forget(store: S3Remote, sandbox_id: str, generation: int) -> None:
    """Remove a stored copy once the sandbox is killed (best effort: it is sealed, and bound to
    a generation nobody will ask for again)."""
    try:
        store.delete(object_name(sandbox_id, generation))
    except Unavailable as e:
        log.warning("the stored copy of %s stays in the store: %s", sandbox_id, e)
