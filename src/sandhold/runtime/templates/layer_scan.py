"""What an image's layers would write, counted before anything is unpacked (issue 27: no
decompression bombs).

Each layer blob of a pulled OCI layout is read as a stream (gzip or zstd decompressed on the way,
never buffered whole) and its tar headers are parsed as Go's ``archive/tar`` (which umoci unpacks
with) reads them: ustar and GNU headers, pax records (``path``, ``size``), GNU long names. Counted
against ``Bounds``: the bytes of every file's data (header-only types, links, directories and
devices, carry none), the entries, and the depth of every path. Sparse files are refused (Go
would expand their holes to real bytes), so are headers this reader cannot vouch for: a bad
checksum, a size that does not parse, a pax record or long name over 1 MiB. Meta headers' data
counts as bytes too, so the work a scan does is bounded by the same budget.

The per-entry depth is a first line only: symlinks can chain paths deeper than any one name, so
``deepest`` measures the unpacked tree too, without recursion.
"""

from __future__ import annotations

import gzip
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from sandhold.errors import TemplateBuildFailed
from sandhold.runtime import safefs

try:
    from compression import zstd  # type: ignore[import-not-found]
except ImportError:  # Python < 3.14
    from backports import zstd

BLOCK = 512
MAX_META = 1 << 20  # a pax record or GNU long name: no image needs more
CHUNK = 1 << 20
_HEADER_ONLY = b"123456"  # hardlink, symlink, char, block, dir, fifo: no data follows (Go)
_DEVICES = b"34"
_META = b"xgLK"  # pax (entry, global), GNU long name, long link name


def refused(why: str) -> TemplateBuildFailed:
    """The layers are not tars this reader vouches for."""
    return TemplateBuildFailed(f"is refused: {why}")


def over(b: Bounds, what: str) -> TemplateBuildFailed:
    """The layers exceed bound ``what`` (``bytes``, ``entries`` or ``depth``) of ``b``."""
    mib = b.bytes >> 20
    return TemplateBuildFailed(
        {
            "bytes": f"unpacks to more than {mib} MiB (template_build_disk_mb)",
            "entries": f"has more than {b.entries} files, the most {mib} MiB hold "
            "(template_build_disk_mb)",
            "depth": f"has paths deeper than {b.depth} directories (template_unpack_max_depth)",
        }[what]
    )


@dataclass(frozen=True)
class Bounds:
    bytes: int
    entries: int
    depth: int


@dataclass
class Tally:
    bytes: int = 0
    entries: int = 0
    devices: list[str] = field(default_factory=list)


def _depth(name: str) -> int:
    return sum(1 for part in name.split("/") if part not in ("", "."))


def _number(raw: bytes) -> int:
    """A numeric header field: octal text, or GNU's base-256 (high bit of the first byte)."""
    if raw and raw[0] & 0x80:
        value = int.from_bytes(bytes([raw[0] & 0x7F]) + raw[1:], "big")
        if raw[0] & 0x40:  # negative
            raise refused("a tar header has a negative number")
        return value
    text = raw.replace(b"\0", b" ").strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise refused(f"a tar header has a number that does not parse: {text[:20]!r}") from None


def _checksum_ok(block: bytes) -> bool:
    want = _number(block[148:156])
    blanked = block[:148] + b" " * 8 + block[156:]
    unsigned = sum(blanked)
    signed = sum(b - 256 if b > 127 else b for b in blanked)
    return want in (unsigned, signed)


def _pax(data: bytes) -> dict[str, str]:
    """Pax records (``"%d %s=%s\\n"``), the last of a key winning (as Go's map)."""
    out: dict[str, str] = {}
    while data:
        length, sep, _ = data.partition(b" ")
        if not sep or not length.isdigit() or not 0 < int(length) <= len(data):
            raise refused("a tar pax header does not parse")
        record, data = data[: int(length)], data[int(length) :]
        key, eq, value = record[len(length) + 1 : -1].partition(b"=")
        if not eq or not record.endswith(b"\n"):
            raise refused("a tar pax record does not parse")
        out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


class _Stream:
    """A layer's tar stream, read forward only, bounded by the budget as it goes."""

    def __init__(self, f: BinaryIO, tally: Tally, bounds: Bounds) -> None:
        self.f = f
        self.tally = tally
        self.bounds = bounds

    def exact(self, n: int) -> bytes:
        data = self.f.read(n)
        while len(data) < n:
            more = self.f.read(n - len(data))
            if not more:
                if not data:
                    return b""
                raise refused("a layer's tar is truncated")
            data += more
        return data

    def skip(self, n: int) -> None:
        while n > 0:
            got = self.f.read(min(n, CHUNK))
            if not got:
                raise refused("a layer's tar is truncated")
            n -= len(got)

    def count(self, size: int) -> None:
        self.tally.bytes += size
        if self.tally.bytes > self.bounds.bytes:
            raise over(self.bounds, "bytes")


@contextmanager
def _open(blob: Path, media_type: str) -> Iterator[BinaryIO]:
    with open(blob, "rb") as raw:
        if media_type.endswith(("+gzip", ".gzip")):
            with gzip.GzipFile(fileobj=raw) as gz:
                yield gz  # type: ignore[misc]
        elif media_type.endswith("+zstd"):
            with zstd.ZstdFile(raw) as zs:
                yield zs
        elif media_type.endswith("tar"):
            yield raw
        else:
            raise refused(f"a layer of type {media_type!r}, which is not a tar")


def scan(layers: list[tuple[Path, str]], bounds: Bounds) -> Tally:
    """Count what ``layers`` (blob path, media type; the lowest first) write; TemplateBuildFailed
    (``over``) at a bound, or (``refused``) saying what is wrong."""
    tally = Tally()
    for blob, media_type in layers:
        try:
            with _open(blob, media_type) as f:
                _scan_tar(_Stream(f, tally, bounds))
        except (OSError, EOFError, zstd.ZstdError) as e:
            raise refused(f"a layer does not decompress: {e}") from None
    return tally


def _scan_tar(s: _Stream) -> None:
    pax: dict[str, str] = {}
    long_name: str | None = None
    while True:
        block = s.exact(BLOCK)
        if not block or block == bytes(BLOCK):
            return  # the end; Go refuses data after a lone zero block, so nothing hides there
        if not _checksum_ok(block):
            raise refused("a layer holds a tar header with a bad checksum")
        kind = block[156:157]
        size = _number(block[124:136])
        s.tally.entries += 1
        if s.tally.entries > s.bounds.entries:
            raise over(s.bounds, "entries")
        if kind in _META:
            if size > MAX_META:
                raise refused("a layer holds a tar header over 1 MiB")
            s.count(size)
            data = s.exact(size)
            s.skip(-size % BLOCK)
            if kind == b"x":  # Go keeps the last one only: so does umoci
                pax = _pax(data)
            elif kind == b"L":
                long_name = data.split(b"\0", 1)[0].decode(errors="replace")
            elif kind == b"g":  # Go returns it as an entry: what came before it is dropped
                pax, long_name = {}, None
            continue
        if kind == b"S" or any(k.startswith("GNU.sparse.") for k in pax):
            raise refused("a layer holds a sparse file, which is not supported")
        name = _name(block, pax, long_name)
        if "size" in pax:
            if not pax["size"].isdigit():
                raise refused("a tar pax size does not parse")
            size = int(pax["size"])
        pax, long_name = {}, None
        if _depth(name) > s.bounds.depth:
            raise over(s.bounds, "depth")
        if kind in _DEVICES:
            s.tally.devices.append(name.removeprefix("./"))
        if kind and kind in _HEADER_ONLY:
            continue
        s.count(size)
        s.skip(size + (-size % BLOCK))


def _name(block: bytes, pax: dict[str, str], long_name: str | None) -> str:
    if "path" in pax:
        return pax["path"]
    if long_name is not None:
        return long_name
    name = block[0:100].split(b"\0", 1)[0]
    if block[257:263] == b"ustar\0":  # ustar/pax (GNU's "ustar  " has no prefix)
        star = block[508:512] == b"tar\0"
        prefix = block[345 : 345 + (131 if star else 155)].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode(errors="replace")


def deepest(root: Path, limit: int) -> int:
    """The depth of ``root``'s deepest entry, walked without recursion or following links;
    stops once past ``limit`` (returns limit + 1)."""
    stack = [(str(root), 0)]
    worst = 0
    while stack:
        path, depth = stack.pop()
        with os.scandir(path) as it:
            for e in it:
                worst = max(worst, depth + 1)
                if worst > limit:
                    return worst
                if e.is_dir(follow_symlinks=False):
                    stack.append((e.path, depth + 1))
    return worst


def drop_devices(root: Path) -> list[str]:
    """Remove the device nodes under ``root`` (a sandbox's /dev is its own; one in a layer would
    be a door to the host's disks), walked without recursion; returns their names."""
    dropped = []

    def drop(dir_fd: int, name: str, st: os.stat_result) -> None:
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            os.unlink(name, dir_fd=dir_fd)
            dropped.append(name)

    safefs.walk(root, drop)
    return sorted(dropped)
