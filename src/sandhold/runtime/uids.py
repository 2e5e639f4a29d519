"""A host uid/gid range per sandbox, so that no two sandboxes share a host identity: should one
escape its mount namespace, a neighbour's processes and files still belong to another user.

Host ids from ``uid_base``: the first 65,536 are the *canonical* range, which owns templates,
workspaces and volumes on disk (sandbox uid ``n`` is host ``uid_base + n`` there) and runs no
process. Range ``slot`` (``0 <= slot < uid_ranges``) starts at ``uid_base + 65536 * (slot + 1)``;
a sandbox runs in one of them and sees the canonical files through idmapped mounts
(``runtime/idmap.py``), so they keep their owner on disk whichever range uses them.

A range is taken by creating ``data_dir/uids/<slot>`` (O_EXCL, so processes sharing the data
directory never hand one out twice), holding the sandbox's id. It is given back by the sandbox's
destroy once nothing it owned remains: its processes are gone (its cgroups are removed), its
writable layer is gone (the disk image is released) and any tree it could write without an
idmap has been given back to the canonical owner. Reconcile gives back ranges whose sandbox
directory no longer exists (a crash between the two). ``uid_isolation = false`` runs every
sandbox in the canonical range, as before ranges existed.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from sandhold.errors import QuotaExceeded
from sandhold.runtime import idmap, mounts
from sandhold.runtime.idmap import ID_RANGE

log = logging.getLogger(__name__)


class UidPool:
    def __init__(self, data_dir: Path, uid_base: int, ranges: int, enabled: bool) -> None:
        self.dir = data_dir / "uids"
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

    def slot_of(self, base: int) -> int | None:
        if base == self.canonical:
            return None
        return (base - self.canonical) // ID_RANGE - 1

    def allocate(self, sandbox_id: str) -> int:
        """Take a free range for ``sandbox_id``; returns its first host id."""
        if not self.enabled:
            return self.canonical
        self.dir.mkdir(mode=0o700, exist_ok=True)
        # The lowest free one: ranges in use stay few and dense, so the user namespaces that
        # map onto them (idmap.UsernsCache) are reused.
        taken = {int(n) for n in os.listdir(self.dir) if n.isdigit()}
        for slot in range(self.ranges):
            if slot not in taken and self._take(slot, sandbox_id):
                return self.base(slot)
        raise QuotaExceeded(
            f"no free host uid range: all {self.ranges} (uid_ranges) are in use by sandboxes; "
            "kill some or raise uid_ranges"
        )

    def _take(self, slot: int, sandbox_id: str) -> bool:
        try:
            fd = os.open(self.dir / str(slot), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                         0o600)  # fmt: skip
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(sandbox_id)
        return True

    def owner(self, slot: int) -> str | None:
        try:
            return (self.dir / str(slot)).read_text()
        except FileNotFoundError:
            return None

    def release(self, base: int, sandbox_id: str) -> None:
        """Give back ``sandbox_id``'s range (if it still holds it: a retried destroy must not
        free a range another sandbox took meanwhile)."""
        slot = self.slot_of(base)
        if slot is not None and self.owner(slot) == sandbox_id:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.dir / str(slot))

    def held(self) -> dict[int, str]:
        """Every taken range: slot -> sandbox id."""
        if not self.dir.is_dir():
            return {}
        out = {}
        for name in os.listdir(self.dir):
            if name.isdigit() and (owner := self.owner(int(name))) is not None:
                out[int(name)] = owner
        return out

    def shift_tree(self, root: Path, to_base: int) -> None:
        """Give every entry under ``root`` owned by an id of this pool to the same id of the
        range at ``to_base`` (lchown: symlinks are never followed). For trees whose filesystem
        cannot be idmapped; costs a walk of the tree."""
        lo, hi = self.canonical, self.end

        def shifted(i: int) -> int:
            return to_base + (i - lo) % ID_RANGE if lo <= i < hi else i

        for path in [str(root), *_walk(root)]:
            try:
                st = os.lstat(path)
                uid, gid = shifted(st.st_uid), shifted(st.st_gid)
                if (uid, gid) != (st.st_uid, st.st_gid):
                    os.lchown(path, uid, gid)  # (clears setuid/setgid bits: left cleared)
            except FileNotFoundError:
                pass

    # -- what a sandbox in range ``base`` sees of canonical trees --------------------------------
    @contextlib.contextmanager
    def lower(self, rootfs: Path, base: int) -> Iterator[Path | int]:
        """The template's root as the sandbox's overlay takes it: an idmapped mount's
        descriptor (open while the context lasts; the overlay keeps its own reference)."""
        if base == self.canonical:
            yield rootfs
            return
        fd = idmap.clone(rootfs, self.userns.get(self.canonical, base))
        try:
            yield fd
        finally:
            os.close(fd)

    def writable(self, d: Path, source: Path, base: int) -> Path:
        """What to bind for a writable canonical tree (a workspace, a volume): an idmapped view
        of it attached under the sandbox's directory, so what the sandbox writes is stored with
        canonical owners. A filesystem that cannot be idmapped (NFS) has its tree shifted to the
        range instead, and back at destroy (``give_back``)."""
        if base == self.canonical:
            return source
        views = d / VIEWS
        views.mkdir(mode=0o755, exist_ok=True)
        try:
            fd = idmap.clone(source, self.userns.get(self.canonical, base))
        except idmap.NotIdmappable as e:
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
        return target

    def give_back(self, d: Path) -> None:
        """Undo ``writable`` for a sandbox being destroyed (its processes are gone)."""
        for target in reversed(mounts.mounts_under(d / VIEWS)):
            mounts.umount(Path(target))
        with contextlib.suppress(FileNotFoundError):
            for line in (d / SHIFTED).read_text().splitlines():
                if line and Path(line).is_dir():
                    self.shift_tree(Path(line), self.canonical)
            os.unlink(d / SHIFTED)


VIEWS = "views"  # idmapped mounts of writable trees, under the sandbox's directory
SHIFTED = "shifted"  # trees given to the sandbox's range by chown, one path per line


def _walk(root: Path) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        out += [os.path.join(dirpath, n) for n in (*dirnames, *filenames)]
    return out
