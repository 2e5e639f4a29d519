"""A template COPY's uploaded archive, read on the host without extracting it: its content
digest (what the layer cache keys on, never the client's claim) and the files hash the
official SDK computes for it (what the client claims), within bounds.

The SDK's ``filesHash`` (e2b ``calculate_files_hash``, Python and JS alike) is sha256 over
``COPY {src} {dest}`` and then, for each file in the order of its path (the SDK sorts its
absolute paths: the context ``.`` first, then plain string order), the relative path, the
``st_mode`` in decimal, the size in decimal (not for a directory) and the content (a regular
file's bytes, a symlink's target). The archive (the SDK's ``tar_file_stream``, the same files)
carries all of it: ``st_mode`` is the entry's type bits plus its mode bits, a hard link is a
regular file with its target's size and content, a symlink's size is its target's length.

Bounds, counted before anything is read past them: the sum of the entries' sizes (the build's
disk budget), the number of entries, a path's depth, and any one read of the decompressed
stream (so a multi-gigabyte pax or long-name header is never buffered). A gzip bomb is refused
from its header's size, its expansion never read; the stream as a whole is bounded too.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import io
import lzma
import stat
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, BinaryIO, Protocol, cast

from sandhold.errors import InvalidRequest
from sandhold.runtime.images import BYTES_PER_INODE

CHUNK = 1 << 16
MAX_READ = 1 << 20  # one read of the stream: a header larger than this is refused
MAX_REWINDS = 16  # rereads from the start for entries out of order (hard links to big files)
LINK_CACHE = 64 << 20  # small hard-link targets kept in memory instead of a reread
LINK_CACHE_ONE = 1 << 20
_BAD = (tarfile.TarError, EOFError, OSError, lzma.LZMAError, zlib.error)


class _Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


@dataclass(frozen=True)
class Bounds:
    max_bytes: int
    max_entries: int
    max_depth: int

    @classmethod
    def for_disk(cls, disk_mb: int, max_depth: int) -> Bounds:
        # entries: ext4's bytes per inode, as many as a disk of the budget holds
        return cls(disk_mb << 20, max(1, (disk_mb << 20) // BYTES_PER_INODE), max_depth)


@dataclass(frozen=True)
class _Entry:
    index: int  # in the archive
    name: str
    mode: int  # st_mode as the SDK stats it
    size: int | None  # None for a directory
    content: int | None  # the archive index whose data is the content (a file, a hard link)
    target: str | None = None  # a symlink's


def digest(f: BinaryIO) -> str:
    """sha256 of the whole stored archive, read from ``f`` (an open upload) from its start."""
    f.seek(0)
    h = hashlib.sha256()
    while chunk := f.read(CHUNK):
        h.update(chunk)
    return h.hexdigest()


def files_hash(f: BinaryIO, src: str, dest: str, bounds: Bounds) -> tuple[str, bool]:
    """The Python SDK's files hash of ``COPY src dest`` over archive ``f``, and whether the
    archive holds a directory (the JS SDK hashes a directory's size on the client's disk too,
    which no archive carries: its claim cannot be recomputed then); InvalidRequest for an
    archive that is not a tar (plain, gzip, bzip2 or xz), out of ``bounds``, or holding what
    the SDK never sends (duplicate, absolute or ``..`` paths, hard links to nothing)."""
    entries = _list(f, bounds)
    h = hashlib.sha256(f"COPY {src} {dest}".encode())
    linked = {e.content for e in entries if e.content is not None and e.content != e.index}
    with _Contents(f, bounds, linked) as contents:
        for e in sorted(entries, key=lambda e: (e.name != ".", e.name)):
            h.update(_utf8(e.name))
            h.update(str(e.mode).encode())
            if e.size is not None:
                h.update(str(e.size).encode())
            if e.target is not None:
                h.update(_utf8(e.target))
            elif e.content is not None and e.size:
                contents.feed(e.content, h.update)
    return h.hexdigest(), any(stat.S_ISDIR(e.mode) for e in entries)


def _list(f: BinaryIO, bounds: Bounds) -> list[_Entry]:
    """The archive's entries as the SDK stats them, checked against ``bounds`` header by header
    (before the data they announce is read)."""
    entries: list[_Entry] = []
    seen: dict[str, _Entry] = {}
    total = 0
    with _Iter(f, bounds) as members:
        for i, m in members:
            e = _entry(i, m, seen, bounds)
            total += m.size
            if total > bounds.max_bytes:
                raise InvalidRequest(_too_big(bounds.max_bytes))
            entries.append(e)
            seen[m.name] = e
    return entries


def _entry(i: int, m: tarfile.TarInfo, seen: dict[str, _Entry], bounds: Bounds) -> _Entry:
    if i >= bounds.max_entries:
        raise InvalidRequest(
            f"the archive has more than {bounds.max_entries} entries (the "
            "build's disk budget / 16 KiB, ext4's bytes per inode)"
        )
    parts = [p for p in m.name.split("/") if p not in ("", ".")]
    if m.name.startswith("/") or ".." in parts:
        raise InvalidRequest(f"the archive's entry {m.name!r} is outside its root")
    if len(parts) > bounds.max_depth:
        raise InvalidRequest(
            f"the archive's entry {m.name[:100]!r}... is deeper than "
            f"{bounds.max_depth} (template_unpack_max_depth)"
        )
    if m.name in seen:
        raise InvalidRequest(f"the archive has {m.name!r} twice")
    perm = m.mode & 0o7777
    if m.isreg():
        return _Entry(i, m.name, stat.S_IFREG | perm, m.size, i)
    if m.isdir():
        return _Entry(i, m.name, stat.S_IFDIR | perm, None, None)
    if m.issym():
        return _Entry(i, m.name, stat.S_IFLNK | perm, len(_utf8(m.linkname)), None, m.linkname)
    if m.islnk():  # the SDK stats the file: its target's
        to = seen.get(m.linkname)
        if to is None or to.content is None:
            raise InvalidRequest(
                f"the archive's hard link {m.name!r} is to {m.linkname!r}, no file before it"
            )
        return _Entry(i, m.name, to.mode, to.size, to.content)
    if m.ischr() or m.isblk() or m.isfifo():
        kind = stat.S_IFCHR if m.ischr() else stat.S_IFBLK if m.isblk() else stat.S_IFIFO
        return _Entry(i, m.name, kind | perm, 0, None)
    raise InvalidRequest(
        f"the archive's entry {m.name!r} is of a kind a copy does not hold (tar type {m.type!r})"
    )


class _Iter:
    """The archive's members in order, with their index, each header read within bounds."""

    def __init__(self, f: BinaryIO, bounds: Bounds) -> None:
        f.seek(0)
        magic = f.read(6)
        f.seek(0)
        # each closed by close(): a decompressor over the upload, which its owner closes
        inner: _Readable = f
        if magic[:2] == b"\x1f\x8b":
            inner = gzip.GzipFile(fileobj=f, mode="rb")
        elif magic[:3] == b"BZh":
            inner = bz2.BZ2File(f)
        elif magic == b"\xfd7zXZ\x00":
            inner = lzma.LZMAFile(f)  # noqa: SIM115
        self.f, self.inner = f, inner
        # The stream's own bound: the entries' data, their headers and padding (a header is a
        # block, a long name or pax header a few more), and the end of the archive.
        limit = bounds.max_bytes + (bounds.max_entries + 2) * 4 * tarfile.BLOCKSIZE + MAX_READ
        self.stream = _Bounded(inner, limit)
        self.index = -1
        try:
            self.tar = tarfile.open(fileobj=cast(IO[bytes], self.stream), mode="r:")  # noqa: SIM115
        except _BAD as e:
            self.close()
            raise InvalidRequest(f"the upload is not a tar archive: {e}") from None
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> _Iter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if hasattr(self, "tar"):
            self.tar.close()
        if self.inner is not self.f and hasattr(self.inner, "close"):
            with contextlib.suppress(*_BAD):
                self.inner.close()

    def __iter__(self) -> _Iter:
        return self

    def __next__(self) -> tuple[int, tarfile.TarInfo]:
        try:
            m = self.tar.next()
        except _BAD as e:
            raise InvalidRequest(f"the archive cannot be read: {e}") from None
        cast(Any, self.tar).members.clear()  # tarfile keeps every member: not on the host
        if m is None:
            raise StopIteration
        self.index += 1
        return self.index, m

    def copy(self, m: tarfile.TarInfo, into: list[Callable[[bytes], Any]]) -> None:
        """Member ``m``'s data into each of ``into`` (a hash's, a buffer's), chunk by chunk."""
        try:
            data = self.tar.extractfile(m)
            assert data is not None
            while chunk := data.read(CHUNK):
                for out in into:
                    out(chunk)
        except _BAD as e:
            raise InvalidRequest(f"the archive cannot be read: {e}") from None


class _Bounded:
    """A decompressed stream read forward only, each read and the total bounded."""

    def __init__(self, inner: _Readable, limit: int) -> None:
        self.inner, self.limit, self.pos = inner, limit, 0

    def read(self, n: int | None = -1) -> bytes:
        if n is None or n < 0 or n > MAX_READ:
            raise InvalidRequest(f"the archive has a header larger than {MAX_READ >> 20} MiB")
        if self.pos + n > self.limit:
            raise InvalidRequest(_too_big(self.limit))
        b = self.inner.read(n)
        self.pos += len(b)
        return b

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            offset += self.pos
        elif whence != io.SEEK_SET or offset < self.pos:
            raise io.UnsupportedOperation("the archive is read forward only")
        while self.pos < offset:  # skipped data is decompressed, and counted
            if not self.read(min(offset - self.pos, CHUNK)):
                break
        return self.pos

    def tell(self) -> int:
        return self.pos

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True


class _Contents:
    """Entries' data fed into the hash in the hash's order, streaming the archive: in order
    (what the SDK uploads) it is read once; an entry behind the stream (a hard link's target)
    comes from memory if small, else from a reread from the start (a few at most)."""

    def __init__(self, f: BinaryIO, bounds: Bounds, linked: set[int]) -> None:
        self.f, self.bounds, self.linked = f, bounds, linked
        self.it = _Iter(f, bounds)
        self.kept: dict[int, bytes] = {}
        self.kept_size = 0
        self.rewinds = 0

    def __enter__(self) -> _Contents:
        return self

    def __exit__(self, *exc: object) -> None:
        self.it.close()

    def feed(self, index: int, update: Callable[[bytes], Any]) -> None:
        if index in self.kept:
            update(self.kept[index])
            return
        if index <= self.it.index:
            self.rewinds += 1
            if self.rewinds > MAX_REWINDS:
                raise InvalidRequest(
                    "the archive's entries are not in the order of their paths "
                    "(as the SDK writes them): too many to reread"
                )
            self.it.close()
            self.it = _Iter(self.f, self.bounds)
        for i, m in self.it:
            if i < index:
                continue
            keep = i in self.linked and m.size <= LINK_CACHE_ONE
            if keep and self.kept_size + m.size <= LINK_CACHE:
                buf = bytearray()
                self.it.copy(m, [update, buf.extend])
                self.kept[i] = bytes(buf)
                self.kept_size += len(buf)
            else:
                self.it.copy(m, [update])
            return
        raise InvalidRequest("the archive changed while it was read")


def _too_big(limit: int) -> str:
    return (
        f"the archive unpacks to more than {limit >> 20} MiB (the build's disk budget, "
        "template_build_disk_mb)"
    )


def _utf8(s: str) -> bytes:
    return s.encode("utf-8", "surrogateescape")
