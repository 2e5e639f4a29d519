"""The sandboxes' records on disk (``sandboxes/<id>/state.json``): the per-sandbox lock, loading
and saving, and a cache of parsed records keyed by each file's version."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sandhold.errors import SandboxNotFound
from sandhold.runtime.records import SandboxInfo, atomic_write
from sandhold.runtime.spec import NAME_RE

Version = tuple[int, int, int, int]


def version_of(st: os.stat_result) -> Version:
    """A record file's version: ``save`` writes a new file, so inode, size and times tell it."""
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class RecordStore:
    def __init__(self, sandboxes_dir: Path) -> None:
        self.sandboxes_dir = sandboxes_dir
        self._cache: dict[str, tuple[Version, SandboxInfo]] = {}

    def dir(self, sandbox_id: str) -> Path:
        """The sandbox's directory; an id that is not a name is a sandbox that does not exist."""
        if not NAME_RE.match(sandbox_id):
            raise SandboxNotFound(f"sandbox {sandbox_id!r} does not exist")
        return self.sandboxes_dir / sandbox_id

    @contextmanager
    def locked(self, sandbox_id: str) -> Iterator[Path]:
        """Serialize operations on one sandbox across threads and processes."""
        d = self.dir(sandbox_id)
        try:
            fd = os.open(d / "lock", os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SandboxNotFound(f"sandbox {sandbox_id!r} does not exist") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not (d / "state.json").exists():
                raise SandboxNotFound(f"sandbox {sandbox_id!r} does not exist")
            yield d
        finally:
            os.close(fd)

    def load(self, d: Path) -> SandboxInfo:
        """The record in ``d``, parsed and validated once per version of its file (a listing
        loads every record)."""
        path = f"{d}/state.json"  # str: a listing loads every record; pathlib's joins cost
        version = version_of(os.stat(path))
        cached = self._cache.get(d.name)
        if cached is None or cached[0] != version:
            with open(path) as f:
                cached = (version, SandboxInfo.from_json(json.load(f), d))
            self._cache[d.name] = cached
        return dataclasses.replace(cached[1], extra=dict(cached[1].extra))

    def save(self, info: SandboxInfo) -> None:
        path = info.dir / "state.json"
        raw = info.to_json()
        atomic_write(path, json.dumps(raw))
        # cached as a load reads it: the next request's ``peek`` finds it
        self._cache[info.id] = (version_of(os.stat(path)), SandboxInfo.from_json(raw, info.dir))

    def cached(self, sandbox_id: str) -> SandboxInfo | None:
        """The record as last loaded or saved if its file has not changed since, with no lock
        or parse (a stat); None otherwise."""
        if not NAME_RE.match(sandbox_id):
            return None
        try:
            st = os.stat(self.sandboxes_dir / sandbox_id / "state.json")
        except OSError:
            return None
        cached = self._cache.get(sandbox_id)
        if cached is None or cached[0] != version_of(st):
            return None
        return cached[1]

    def forget(self, sandbox_id: str) -> None:
        self._cache.pop(sandbox_id, None)
