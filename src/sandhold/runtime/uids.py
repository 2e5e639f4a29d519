"""A host uid/gid range per sandbox, so that no two sandboxes share a host identity: should one
escape its mount namespace, a neighbour's processes and files still belong to another user.

Host ids from ``uid_base``: the first 65,536 are the *canonical* range, which owns templates,
workspaces and volumes on disk (sandbox uid ``n`` is host ``uid_base + n`` there) and runs no
process. Range ``slot`` (``0 <= slot < uid_ranges``) starts at ``uid_base + 65536 * (slot + 1)``; a
sandbox runs in one of them and sees the canonical files through idmapped mounts
(``runtime/idmap.py``), so they keep their owner on disk whichever range uses them.

Ranges are a host resource, shared by every runtime on the host whatever its data directory: the
registry (``uid_registry``, default ``/var/lib/sandhold-uid-ranges``) holds one file per range
taken, named by its first host id (made under a temporary name and linked into place, so two
processes never take one twice and nobody reads a half-written one). It holds the data directory's
id (``instance.py``: not its path, which two hosts in pods may share), the sandbox id, the data
directory's path and the mount namespace that saw it (``Entry``). A range is given back by its
sandbox's destroy once nothing it owned remains: its processes are gone (its cgroups are removed),
its writable layer is gone (the disk image is released) and any tree it wrote without an idmap is
back with the canonical owner. Reconcile gives back its own ranges whose sandbox directory is gone
(a crash between the two), and those of data directories that no longer exist
(``release_orphans``): judged only for entries made in its own mount namespace, where their path
means what it meant. ``uid_isolation = false`` runs every sandbox in the canonical range (one host
identity for all), as before ranges existed.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sandhold.errors import QuotaExceeded
from sandhold.runtime import idmap, instance, mounts, safefs
from sandhold.runtime.idmap import ID_RANGE

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Entry:
    """A registry file: who took the range. An entry of before instance ids has two lines (the
    data dir's path, the sandbox id): its path is its owner, its namespace unknown."""

    owner: str  # the data dir's instance id (or, in an old entry, its path)
    sandbox_id: str
    data_dir: str
    mnt_ns: str | None

    @classmethod
    def parse(cls, text: str) -> Entry:
        lines = text.splitlines()
        if len(lines) >= 4:
            return cls(lines[0], lines[1], lines[2], lines[3])
        owner, sandbox_id = lines[:2]
        return cls(owner, sandbox_id, owner, None)


def mount_namespace() -> str:
    return os.readlink("/proc/self/ns/mnt")


def _gone(entry: Entry) -> bool:
    """Whether the data dir that took ``entry`` is surely gone: nothing at its path. Another data
    dir at that path (its id differs) may be another host's storage seen through the same path:
    its entry stays (a range kept too long is a leak; one given back too soon, a shared uid)."""
    return not os.path.isdir(entry.data_dir)


class UidPool:
    def __init__(
        self, registry: Path, data_dir: Path, uid_base: int, ranges: int, enabled: bool
    ) -> None:
        self.registry = registry
        self.root = data_dir
        self.data_dir = str(data_dir.resolve())
        self._instance: str | None = None  # read once found: it never changes
        self.canonical = uid_base
        self.ranges = ranges
        self.enabled = enabled
        self.userns = idmap.UsernsCache()

    @property
    def end(self) -> int:
        """One past the last host id any sandbox of this pool may own."""
        return self.canonical + ID_RANGE * (self.ranges + 1)

    def base(self, slot: int) -> int:
        return self.canonical + ID_RANGE * (slot + 1)

    def allocate(self, sandbox_id: str) -> int:
        """Take a free range for ``sandbox_id``; returns its first host id."""
        if not self.enabled:
            return self.canonical
        self.registry.mkdir(mode=0o700, parents=True, exist_ok=True)
        # The lowest free one: ranges in use stay few and dense, so the user namespaces that
        # map onto them (idmap.UsernsCache) are reused.
        taken = set(os.listdir(self.registry))
        tmp = self.registry / f".{sandbox_id}.{os.getpid()}.tmp"
        owner = self._instance = self._instance or instance.ensure(self.root)
        tmp.write_text(f"{owner}\n{sandbox_id}\n{self.data_dir}\n{mount_namespace()}\n")
        try:
            for slot in range(self.ranges):
                base = self.base(slot)
                if str(base) in taken:
                    continue
                with contextlib.suppress(FileExistsError):
                    os.link(tmp, self.registry / str(base))
                    return base
        finally:
            tmp.unlink()
        raise QuotaExceeded(
            f"no free host uid range: all {self.ranges} (uid_ranges) are in use by sandboxes; "
            "kill some or raise uid_ranges"
        )

    def _entry(self, base: int) -> Entry | None:
        try:
            return Entry.parse((self.registry / str(base)).read_text())
        except (FileNotFoundError, ValueError):
            return None

    def _ours(self, entry: Entry) -> bool:
        """Taken by this data dir: by its id, or (an old entry) by its path."""
        if entry.mnt_ns is None:
            return entry.owner == self.data_dir
        if self._instance is None:
            self._instance = instance.read(self.root)
        return entry.owner == self._instance

    def release(self, base: int, sandbox_id: str) -> None:
        """Give back ``sandbox_id``'s range (if it still holds it: a retried destroy must not
        free a range another sandbox took meanwhile)."""
        entry = self._entry(base)
        mine = entry is not None and entry.sandbox_id == sandbox_id and self._ours(entry)
        if base != self.canonical and mine:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.registry / str(base))

    def held(self) -> dict[int, str]:
        """The ranges this data directory's sandboxes hold: first host id -> sandbox id."""
        return {base: e.sandbox_id for base, e in self._entries() if self._ours(e)}

    def release_orphans(self) -> int:
        """Give back the ranges of data directories that no longer exist (removed with their
        sandboxes still recorded); returns how many. An entry made in another mount namespace
        is never judged: its path may name other storage there (another host's pod)."""
        freed = 0
        here = mount_namespace()
        for base, entry in list(self._entries()):
            if entry.mnt_ns not in (None, here) or not _gone(entry):
                continue
            if self._entry(base) == entry:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.registry / str(base))
                    freed += 1
        return freed

    def _entries(self) -> Iterator[tuple[int, Entry]]:
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(self.registry):
                if name.isdigit() and (entry := self._entry(int(name))) is not None:
                    yield int(name), entry

    def shift_tree(self, root: Path, to_base: int) -> None:
        """Give every entry under ``root`` owned by an id of this pool to the same id of the
        range at ``to_base`` (lchown: symlinks are never followed). For trees whose filesystem
        cannot be idmapped; costs a walk of the tree."""
        lo, hi = self.canonical, self.end

        def shifted(i: int) -> int:
            return to_base + (i - lo) % ID_RANGE if lo <= i < hi else i

        def shift(dir_fd: int | None, name: str, st: os.stat_result) -> None:
            uid, gid = shifted(st.st_uid), shifted(st.st_gid)
            if (uid, gid) != (st.st_uid, st.st_gid):  # clears setuid/setgid bits: left so
                with contextlib.suppress(FileNotFoundError):
                    os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)

        with contextlib.suppress(FileNotFoundError):
            shift(None, str(root), os.lstat(root))
            safefs.walk(root, shift)

    # -- what a sandbox in range ``base`` sees of canonical trees --------------------------------
    @contextlib.contextmanager
    def lower(self, dirs: list[Path], base: int, at: Path) -> Iterator[list[Path]]:
        """The template's directories (its layers, then its root) as the sandbox's overlay
        takes them: idmapped views of them, attached under ``at`` (the sandbox's directory)
        while the context lasts. Attached, not detached: kernels before about 6.15 refuse a
        detached mount as an overlay layer ("failed to clone lowerpath"); the overlay keeps
        its own references, so the views are unmounted once it is made."""
        if base == self.canonical:
            yield list(dirs)
            return
        views = at / LOWER_VIEWS
        views.mkdir(mode=0o700, exist_ok=True)
        attached: list[Path] = []
        try:
            for i, d in enumerate(dirs):
                fd = idmap.clone(d, self.userns.get(self.canonical, base))
                try:
                    target = views / str(i)
                    target.mkdir(exist_ok=True)
                    idmap.attach(fd, target)
                    attached.append(target)
                finally:
                    os.close(fd)
            yield attached
        finally:
            for target in attached:
                mounts.detach(target)  # attached above: no need to scan the mount table
                with contextlib.suppress(OSError):
                    target.rmdir()
            with contextlib.suppress(OSError):
                views.rmdir()

    def writable(self, d: Path, source: Path, base: int, mountpoint: str) -> Path:
        """What to bind for a writable canonical tree (a workspace, a volume): an idmapped view
        of it attached under the sandbox's directory, so what the sandbox writes is stored with
        canonical owners. A filesystem that cannot be idmapped (NFS) has its tree shifted to the
        range instead, and back at destroy (``give_back``). Views are listed, with the path
        the sandbox sees each at, in ``VIEW_LIST`` (a checkpoint names them by it)."""
        if base == self.canonical:
            return source
        views = d / VIEWS
        views.mkdir(mode=0o755, exist_ok=True)
        try:
            fd = idmap.clone(source, self.userns.get(self.canonical, base))
        except OSError as e:
            if e.errno not in idmap.UNSUPPORTED:
                raise
            log.info("%s; shifting its owners to the sandbox's range instead", e)
            with open(d / SHIFTED, "a") as f:  # recorded first: a crash mid-walk is undone too
                f.write(f"{source}\n")
            self.shift_tree(source, base)
            return source
        try:
            target = views / str(len(os.listdir(views)))
            target.mkdir()
            idmap.attach(fd, target)
        finally:
            os.close(fd)
        with open(d / VIEW_LIST, "a") as f:
            f.write(f"{mountpoint}\t{target}\n")
        return target

    def give_back(self, d: Path) -> None:
        """Undo ``writable`` for a sandbox being destroyed (its processes are gone)."""
        for target in reversed(mounts.mounts_under(d / VIEWS)):
            mounts.umount(Path(target))
            with contextlib.suppress(OSError):
                os.rmdir(target)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(d / VIEW_LIST)
        with contextlib.suppress(FileNotFoundError):
            for line in (d / SHIFTED).read_text().splitlines():
                if line and Path(line).is_dir():
                    self.shift_tree(Path(line), self.canonical)
            os.unlink(d / SHIFTED)


VIEWS = "views"  # idmapped mounts of writable trees, under the sandbox's directory
VIEW_LIST = "views.list"  # "<path inside>\t<view>" per line
LOWER_VIEWS = "lowers"  # a create's idmapped views of the template, for its overlay only
SHIFTED = "shifted"  # trees given to the sandbox's range by chown, one path per line
