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

With ``snapshot_s3_bucket`` set the store has a remote (snapshot_remote.py), which is the truth:
a snapshot is uploaded, sealed, before it is listed (an upload that fails leaves nothing); one
known only there is listed and, when started, first downloaded into ``data_dir/snapshots``
(a temporary directory renamed into place); a delete removes both; a local copy of a snapshot
deleted through another server is dropped. Local copies are then a cache: the budget evicts
the least recently used ones that are not in use rather than refuse.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import string
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from sandhold.errors import (
    CheckpointFailed,
    Conflict,
    QuotaExceeded,
    TemplateNotFound,
    Unsupported,
)
from sandhold.runtime import assembly, disk, safefs
from sandhold.runtime.checkpoint import fork
from sandhold.runtime.checkpoint.snapshot_remote import remote_for
from sandhold.runtime.host import Sandboxes
from sandhold.runtime.records import SandboxInfo
from sandhold.runtime.spec import SandboxSpec

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
    remote: str | None = None  # the remote store it is kept in (s3://bucket/prefix), if any
    dir: Path = Path()

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        del d["dir"]
        return d


def _size(path: Path) -> int:
    return safefs.tree_size(path)


class SnapshotStore:
    def __init__(self, sandboxes: Sandboxes) -> None:
        self.sandboxes = sandboxes  # to start sandboxes from snapshots
        self.host = sandboxes.host
        self.root = self.host.settings.data_dir / ROOT
        self.remote = remote_for(self.host.settings)

    def _dir(self, snapshot_id: str) -> Path:
        alphabet = set(string.ascii_lowercase + string.digits + "-")
        if not snapshot_id.startswith(ID_PREFIX) or set(snapshot_id) - alphabet:
            raise TemplateNotFound(f"snapshot {snapshot_id!r} does not exist")
        return self.root / snapshot_id

    def _local(self, snapshot_id: str) -> Snapshot | None:
        d = self._dir(snapshot_id)
        try:
            data = json.loads((d / META).read_text())
        except FileNotFoundError:
            return None
        return Snapshot(**data, dir=d)

    def _shared(self, snap: Snapshot) -> bool:
        """Whether ``snap`` is (to be) kept in this store's remote."""
        return self.remote is not None and snap.remote == self.remote.url

    def get(self, snapshot_id: str) -> Snapshot:
        snap = self._local(snapshot_id)
        if self.remote is not None and (snap is None or self._shared(snap)):
            if snap is not None and self.remote.exists(snapshot_id):
                return snap
            data = None if snap is not None else self.remote.get(snapshot_id)
            if data is not None:
                remote = _from_remote(data, self._dir(snapshot_id))
                if remote is None:
                    raise CheckpointFailed(
                        f"snapshot {snapshot_id}: its metadata in {self.remote.url} is not one "
                        "this server reads"
                    )
                return remote
            if snap is not None:
                self._evict(snap.dir)  # deleted through another server
            snap = None
        if snap is None:
            raise TemplateNotFound(f"snapshot {snapshot_id!r} does not exist")
        return snap

    def local(self) -> list[Snapshot]:
        """The snapshots with a copy on this host's disk."""
        return self._list_local()

    def _list_local(self) -> list[Snapshot]:
        if not self.root.is_dir():
            return []
        out = []
        for d in sorted(self.root.iterdir()):
            if d.name.startswith(ID_PREFIX):
                try:
                    snap = self._local(d.name)
                except (TemplateNotFound, ValueError, TypeError):
                    continue
                if snap is not None:
                    out.append(snap)
        return out

    def list(self) -> list[Snapshot]:
        out = self._list_local()
        if self.remote is not None:
            shared = self.remote.list()
            for snap in [s for s in out if self._shared(s) and s.id not in shared]:
                self._evict(snap.dir)  # deleted through another server
                out.remove(snap)
            known = {s.id for s in out}
            for snapshot_id, data in shared.items():
                found = _from_remote(data, self._dir(snapshot_id))
                if found is not None and snapshot_id not in known:
                    out.append(found)
        return sorted(out, key=lambda s: s.created_at)

    def delete(self, snapshot_id: str) -> None:
        snap = self._local(snapshot_id)
        found = snap is not None
        if self.remote is not None and (snap is None or self._shared(snap)):
            found = self.remote.delete(snapshot_id) or found
        if snap is not None:
            _discard(snap.dir)
        if not found:
            raise TemplateNotFound(f"snapshot {snapshot_id!r} does not exist")

    def _evict(self, d: Path) -> bool:
        """Drop the local copy ``d`` unless a start is reading it; whether it went."""
        try:
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        else:
            _discard(d)
            return True
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _in_use(self, snap: Snapshot) -> Iterator[None]:
        """Hold the local copy of ``snap`` (fetched first if it is only in the remote) against
        eviction while a sandbox is made from it."""
        for _ in range(3):
            if not (snap.dir / META).exists():
                self._fetch(snap)
            try:
                fd = os.open(snap.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # evicted or deleted meanwhile
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
                if not (snap.dir / META).exists():
                    continue
                os.utime(fd)  # least recently used goes first
                yield
                return
            finally:
                os.close(fd)
        raise TemplateNotFound(f"snapshot {snap.id!r} does not exist")

    def _fetch(self, snap: Snapshot) -> None:
        if self.remote is None or not self._shared(snap):
            raise TemplateNotFound(f"snapshot {snap.id!r} does not exist")
        self.root.mkdir(mode=0o700, exist_ok=True)
        self._check_budget(snap.size_bytes)
        tmp = Path(tempfile.mkdtemp(prefix=f".fetch-{snap.id}-", dir=self.root))
        try:
            self.remote.fetch(snap.id, tmp)
            try:
                tmp.rename(snap.dir)
            except OSError as e:  # fetched by another start at the same time: theirs is good
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
        finally:
            safefs.remove_quietly(tmp)

    def take(
        self,
        sandbox_id: str,
        owner: str,
        name: str | None,
        mode: Mode,
        extra: dict[str, object] | None = None,
    ) -> Snapshot:
        """Save a running (or, ``filesystem`` only, paused) sandbox; it runs on. With a remote,
        the snapshot is uploaded before it exists here too."""
        host = self.host
        self.root.mkdir(mode=0o700, exist_ok=True)
        self._check_budget()
        snapshot_id = ID_PREFIX + secrets.token_hex(8)
        staging = self.root / f".new-{snapshot_id}"
        staging.mkdir(mode=0o700)
        try:
            with host.records.locked(sandbox_id) as d:
                info = host.records.load(d)
                _check(info, mode)
                fork.checkpoint_in_place(host, info, staging, memory=mode == "full")
            # What its sandboxes get: never the source's host directories (a workspace, mounts).
            spec = info.spec.model_copy(
                update={"workspace_id": None, "workspace_dir": None, "mounts": []}
            )
            snap = Snapshot(
                id=snapshot_id,
                owner=owner,
                names=[name] if name else [],
                source=info.id,
                template=info.template,
                mode=mode,
                spec=spec.model_dump(mode="json"),
                created_at=time.time(),
                size_bytes=_size(staging),
                extra=dict(extra or {}),
                remote=self.remote.url if self.remote is not None else None,
            )
            (staging / META).write_text(json.dumps(snap.to_json()))
            if self.remote is not None:
                self.remote.put(snap.to_json(), staging)
            try:
                staging.rename(self.root / snapshot_id)
            except BaseException:
                if self.remote is not None:
                    with contextlib.suppress(Exception):
                        self.remote.delete(snapshot_id)
                raise
        except BaseException:
            safefs.remove_quietly(staging)
            raise
        snap.dir = self.root / snapshot_id
        return snap

    def _check_budget(self, need: int = 0) -> None:
        """Room for ``need`` more bytes under the budget; with a remote, by evicting the least
        recently used local copies (they stay in the remote) first."""
        limit = self.host.settings.snapshot_store_max_mb << 20
        local = self._list_local()
        used = sum(s.size_bytes for s in local)
        if used + need >= limit and self.remote is not None:
            copies = sorted((s for s in local if self._shared(s)), key=_last_used)
            for snap in copies:
                if used + need < limit:
                    break
                if self._evict(snap.dir):
                    used -= snap.size_bytes
        if used + need >= limit:
            raise QuotaExceeded(
                f"the snapshot store is full ({used >> 20} MiB of snapshot_store_max_mb="
                f"{limit >> 20}, {need >> 20} MiB more needed): delete snapshots first"
            )

    def start(
        self,
        snap: Snapshot,
        extra: dict[str, object],
        spec: SandboxSpec | None = None,
        sandbox_id: str | None = None,
    ) -> SandboxInfo:
        """A new sandbox from ``snap``: its memory restored (``full``) or booted afresh over
        its files (``filesystem``; ``spec`` may change what a fresh boot may, e.g. env)."""
        saved = SandboxSpec.model_validate(snap.spec, context={"stored": True})
        with self._in_use(snap):
            if snap.mode == "full":
                sandbox_id = assembly.free_id(self.host, sandbox_id)
                return fork.start(
                    self.host, saved, snap.template, snap.dir, extra, "snapshot", None, sandbox_id
                )
            return self.sandboxes.create(
                spec or saved, extra, layer_image=snap.dir / disk.IMAGE, sandbox_id=sandbox_id
            )


def _from_remote(data: dict[str, object], d: Path) -> Snapshot | None:
    try:
        return Snapshot(**data, dir=d)  # type: ignore[arg-type]
    except TypeError:  # written by another version of Sandhold
        return None


def _discard(d: Path) -> None:
    trash = d.with_name(f".gone-{d.name}-{secrets.token_hex(4)}")
    try:
        d.rename(trash)  # gone for readers at once
    except FileNotFoundError:
        return
    safefs.remove_quietly(trash)


def _last_used(snap: Snapshot) -> float:
    try:
        return os.stat(snap.dir).st_mtime
    except FileNotFoundError:
        return 0.0


def _check(info: SandboxInfo, mode: Mode) -> None:
    if info.state == "failed":
        raise Conflict(f"sandbox {info.id} failed ({info.failure}); it can only be killed")
    if info.spec.limits.disk_mb is None:
        raise Unsupported(
            f"sandbox {info.id} cannot be snapshotted: it has no disk budget (disk_enforced=false)"
        )
    if mode == "full":
        fork.check_forkable(info, "snapshotted with its memory")
