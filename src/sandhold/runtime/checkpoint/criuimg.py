"""The one edit Sandhold makes to a CRIU image: the host range a sandbox's user namespace maps
onto (``userns-*.img``), so that a snapshot or fork restores in a uid range of its own.

The image is CRIU's usual layout (two magic words, then one entry: a 32-bit size and a
protobuf ``userns_entry`` of repeated ``uid_map`` = 1 and ``gid_map`` = 2, each an extent of
varints ``first`` = 1, ``lower_first`` = 2, ``count`` = 3). Nothing else is kept but what CRIU
wrote; any other shape is refused rather than guessed at.
"""

from __future__ import annotations

import struct
from pathlib import Path

from sandhold.errors import CheckpointFailed


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def _enc_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        out.append(b | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _fields(buf: bytes) -> list[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of a message made of varints and length-delimited."""
    out: list[tuple[int, int, int | bytes]] = []
    i = 0
    while i < len(buf):
        tag, i = _varint(buf, i)
        num, kind = tag >> 3, tag & 7
        if kind == 0:
            value, i = _varint(buf, i)
            out.append((num, kind, value))
        elif kind == 2:
            size, i = _varint(buf, i)
            out.append((num, kind, buf[i : i + size]))
            i += size
        else:
            raise CheckpointFailed(f"unexpected protobuf wire type {kind} in a userns image")
    return out


def _encode(fields: list[tuple[int, int, int | bytes]]) -> bytes:
    out = bytearray()
    for num, kind, value in fields:
        out += _enc_varint(num << 3 | kind)
        if isinstance(value, int):
            out += _enc_varint(value)
        else:
            out += _enc_varint(len(value)) + value
    return bytes(out)


def remap(payload: bytes, host_uid: int) -> bytes:
    """The entry with every extent's ``lower_first`` moved to ``host_uid + first``."""
    fields = []
    for num, kind, value in _fields(payload):
        if num in (1, 2) and isinstance(value, bytes):
            ext = dict((n, v) for n, _k, v in _fields(value))
            first = ext.get(1, 0)
            if not isinstance(first, int) or set(ext) - {1, 2, 3}:
                raise CheckpointFailed("unexpected uid/gid extent in a userns image")
            ext[2] = host_uid + first
            value = _encode([(n, 0, ext[n]) for n in sorted(ext)])
        fields.append((num, kind, value))
    return _encode(fields)


def remap_userns(images: Path, host_uid: int) -> None:
    """Make the images' user namespace map onto the range at ``host_uid``."""
    for image in images.glob("userns-*.img"):
        data = image.read_bytes()
        (size,) = struct.unpack_from("<I", data, 8)
        if len(data) != 12 + size:
            raise CheckpointFailed(f"{image.name}: not a single-entry CRIU image")
        payload = remap(data[12:], host_uid)
        image.write_bytes(data[:8] + struct.pack("<I", len(payload)) + payload)
