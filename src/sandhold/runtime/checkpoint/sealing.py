"""Sealing a snapshot's objects for the remote store (snapshot_remote.py).

Every object, the metadata too, is sealed with the secrets key ring (``egress/secrets.py``,
AES-256-GCM under its newest key), in records of at most ``CHUNK`` bytes of plaintext, so no
image is ever held in memory whole::

    MAGIC, then per record: u32 length | u8 final | key id (12) | nonce (12) | ciphertext
    associated data: "sandhold-snapshot" 0 <object name> 0 u64 index | u8 final
    plaintext: u64 offset | bytes        (final record: u64 file size | u64 records before it)

The object's name (its key under the prefix) in the associated data keeps an object from
opening in another's place, the index keeps records in order, and the final record (its flag
authenticated too) shows that nothing was cut off. Only a file's data extents are stored: a
sparse disk image is uploaded and restored with its holes.
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

from cryptography.exceptions import InvalidTag

from sandhold.egress.secrets import KeyRing
from sandhold.errors import CheckpointFailed

MAGIC = b"SHSNAP1\n"
CHUNK = 8 << 20  # plaintext per record
_HEAD = struct.Struct(">IB12s12s")
_TAG = 16


def broken(why: str) -> CheckpointFailed:
    """What does not open, said briefly; the caller names the snapshot and the object."""
    return CheckpointFailed(why)


def _aad(name: str, index: int, final: bool) -> bytes:
    return b"sandhold-snapshot\0" + name.encode() + b"\0" + struct.pack(">QB", index, final)


def _record(ring: KeyRing, name: str, index: int, final: bool, plain: bytes) -> bytes:
    key_id, nonce, sealed = ring.seal(plain, _aad(name, index, final))
    return _HEAD.pack(len(sealed), final, key_id.encode(), nonce) + sealed


def _extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """The (start, end) of the data in a file, skipping holes."""
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # only a hole is left
                return
            if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
            yield pos, size  # a filesystem without SEEK_DATA: all of it
            return
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        yield start, end
        pos = end


def seal_file(ring: KeyRing, name: str, path: Path) -> Generator[bytes, None, None]:
    """The sealed object of ``path``, record by record."""
    yield MAGIC
    index = 0
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        size = os.fstat(fd).st_size
        for start, end in _extents(fd, size):
            pos = start
            while pos < end:
                data = os.pread(fd, min(CHUNK, end - pos), pos)
                if not data:
                    raise OSError(errno.EIO, f"{path} shrank while it was read")
                yield _record(ring, name, index, False, struct.pack(">Q", pos) + data)
                pos += len(data)
                index += 1
    finally:
        os.close(fd)
    yield _record(ring, name, index, True, struct.pack(">QQ", size, index))


def seal_bytes(ring: KeyRing, name: str, data: bytes) -> bytes:
    head = [_record(ring, name, 0, False, struct.pack(">Q", 0) + data)] if data else []
    return (
        MAGIC
        + b"".join(head)
        + _record(ring, name, len(head), True, struct.pack(">QQ", len(data), len(head)))
    )


def unseal(
    ring: KeyRing, name: str, read: Callable[[int], bytes], write: Callable[[int, bytes], None]
) -> int:
    """Open a sealed object read through ``read(n)``, handing each piece to ``write(offset,
    data)``; the file's size. Raises CheckpointFailed for anything that is not exactly what
    ``seal_file`` made for ``name``; ``SecretKeyError`` for a key not in the ring."""
    if _read_exactly(read, len(MAGIC)) != MAGIC:
        raise broken("not a sealed snapshot object")
    index = 0
    while True:
        head = _read_exactly(read, _HEAD.size)
        if len(head) < _HEAD.size:
            raise broken("it ends before its final record (truncated)")
        length, final, key_id, nonce = _HEAD.unpack(head)
        if final not in (0, 1) or not _TAG + 8 <= length <= CHUNK + 16 + _TAG:
            raise broken(f"record {index} has a malformed header")
        sealed = _read_exactly(read, length)
        if len(sealed) < length:
            raise broken("it ends inside a record (truncated)")
        try:
            plain = ring.open(
                key_id.decode("ascii", "replace"), nonce, sealed, _aad(name, index, bool(final))
            )
        except InvalidTag:
            raise broken(f"record {index} fails its authentication") from None
        if final:
            if len(plain) != 16:
                raise broken("its final record is malformed")
            size, count = struct.unpack(">QQ", plain)
            if count != index or read(1):
                raise broken("its records do not add up")
            return int(size)
        if len(plain) < 8:
            raise broken(f"record {index} is malformed")
        (offset,) = struct.unpack(">Q", plain[:8])
        write(offset, plain[8:])
        index += 1


def _read_exactly(read: Callable[[int], bytes], n: int) -> bytes:
    out = b""
    while len(out) < n:
        got = read(n - len(out))
        if not got:
            break
        out += got
    return out
