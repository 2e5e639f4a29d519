"""Snapshots: a sandbox's state saved as a persistent object of its own, independent of the
sandbox (which may be killed), kept across restarts, and started again as new sandboxes.

``data_dir/snapshots/<id>/`` holds ``snapshot.json`` (owner, names, source, template, the spec
new sandboxes get, mode, size), ``disk.img`` (a copy of the writable layer) and, for a ``full``
snapshot, ``checkpoint/`` (the memory image, CRIU's). A snapshot is written under a temporary
name and renamed into place, so a half-made one is never listed; the store's total size is
bounded by ``snapshot_store_max_mb``. Images hold process memory: the directory is root's only
(0700); a restore copies them into the new sandbox's own directory.

``full`` needs CRIU and what a fork needs (fork.py); ``filesystem`` needs only the layer image
and starts new sandboxes cold (a fresh boot over the saved files).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import string
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from sandhold.errors import Conflict, QuotaExceeded, TemplateNotFound, Unsupported
from sandhold.runtime import disk, fork
from sandhold.runtime.records import SandboxInfo
from sandhold.runtime.spec import SandboxSpec

if TYPE_CHECKING:
    from sandhold.runtime.runtime import Runtime

Mode = Literal["full", "filesystem"]
ROOT = "snapshots"
META = "snapshot.json"
ID_PREFIX = "snap-"


@dataclass
class Snapshot:
    id: str
    owner: str
    names: list[str]
    source: str  # the sandbox it was taken of
    template: str
    mode: Mode
    spec: dict[str, object]  # what sandboxes started from it get (SandboxSpec, as JSON)
    created_at: float
    size_bytes: int = 0
    extra: dict[str, object] = field(default_factory=dict)  # upper layers' (the lifecycle's)
    dir: Path = Path()

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        del d["dir"]
        return d


def _size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


class SnapshotStore:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.root = rt.settings.data_dir / ROOT

    def _dir(self, snapshot_id: str) -> Path:
        alphabet = set(string.ascii_lowercase + string.digits + "-")
        if not snapshot_id.startswith(ID_PREFIX) or set(snapshot_id) - alphabet:
            raise TemplateNotFound(f"snapshot {snapshot_id!r} does not exist")
        return self.root / snapshot_id

    def get(self, snapshot_id: str) -> Snapshot:
        d = self._dir(snapshot_id)
        try:
            data = json.loads((d / META).read_text())
        except FileNotFoundError:
            raise TemplateNotFound(f"snapshot {snapshot_id!r} does not exist") from None
        return Snapshot(**data, dir=d)

    def list(self) -> list[Snapshot]:
        if not self.root.is_dir():
            return []
        out = []
        for d in sorted(self.root.iterdir()):
            if d.name.startswith(ID_PREFIX):
                try:
                    out.append(self.get(d.name))
                except (TemplateNotFound, ValueError, TypeError):
                    continue
        return sorted(out, key=lambda s: s.created_at)

    def delete(self, snapshot_id: str) -> None:
        d = self._dir(snapshot_id)
        if not (d / META).exists():
            raise TemplateNotFound(f"snapshot {snapshot_id!r} does not exist")
        trash = d.with_name(f".gone-{d.name}")
        d.rename(trash)  # gone for readers at once
        shutil.rmtree(trash, ignore_errors=True)

    def take(self, sandbox_id: str, owner: str, name: str | None, mode: Mode,
             extra: dict[str, object] | None = None) -> Snapshot:  # fmt: skip
        """Save a running (or, ``filesystem`` only, paused) sandbox; it runs on."""
        rt = self.rt
        self.root.mkdir(mode=0o700, exist_ok=True)
        self._check_budget()
        snapshot_id = ID_PREFIX + secrets.token_hex(8)
        staging = self.root / f".new-{snapshot_id}"
        staging.mkdir(mode=0o700)
        try:
            with rt._locked(sandbox_id) as d:
                info = rt._load(d)
                _check(info, mode)
                fork.checkpoint_in_place(rt, info, staging, memory=mode == "full")
            # What its sandboxes get: never the source's host directories (a workspace, mounts).
            spec = info.spec.model_copy(
                update={"workspace_id": None, "workspace_dir": None, "mounts": []}
            )
            snap = Snapshot(
                id=snapshot_id, owner=owner, names=[name] if name else [], source=info.id,
                template=info.template, mode=mode, spec=spec.model_dump(mode="json"),
                created_at=time.time(), size_bytes=_size(staging), extra=dict(extra or {}),
            )  # fmt: skip
            (staging / META).write_text(json.dumps(snap.to_json()))
            staging.rename(self.root / snapshot_id)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        snap.dir = self.root / snapshot_id
        return snap

    def _check_budget(self) -> None:
        limit = self.rt.settings.snapshot_store_max_mb << 20
        used = sum(s.size_bytes for s in self.list())
        if used >= limit:
            raise QuotaExceeded(
                f"the snapshot store is full ({used >> 20} MiB of snapshot_store_max_mb="
                f"{limit >> 20}): delete snapshots first"
            )

    def start(self, snap: Snapshot, extra: dict[str, object],
              spec: SandboxSpec | None = None) -> SandboxInfo:  # fmt: skip
        """A new sandbox from ``snap``: its memory restored (``full``) or booted afresh over
        its files (``filesystem``; ``spec`` may change what a fresh boot may, e.g. env)."""
        saved = SandboxSpec.model_validate(snap.spec, context={"stored": True})
        if snap.mode == "full":
            return fork.start(self.rt, saved, snap.template, snap.dir, extra)
        return self.rt.create(spec or saved, extra, layer_image=snap.dir / disk.IMAGE)


def _check(info: SandboxInfo, mode: Mode) -> None:
    if info.state == "failed":
        raise Conflict(f"sandbox {info.id} failed ({info.failure}); it can only be killed")
    if info.spec.limits.disk_mb is None:
        raise Unsupported(
            f"sandbox {info.id} cannot be snapshotted: it has no disk budget (disk_enforced=false)"
        )
    if mode == "full":
        fork.check_forkable(info, "snapshotted with its memory")
