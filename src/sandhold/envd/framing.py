"""Connect's streaming framing: each message is a 5-byte prefix (flags, big-endian length) and
a JSON payload; the last one of a server stream has the END_STREAM flag."""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator
from typing import Any

END_STREAM = 0x02


def envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    payload = json.dumps(message).encode()
    return struct.pack(">BI", flags, len(payload)) + payload


async def iter_envelopes(chunks: AsyncIterator[bytes]) -> AsyncIterator[tuple[int, dict[str, Any]]]:
    buf = b""
    async for chunk in chunks:
        buf += chunk
        while len(buf) >= 5:
            flags, size = struct.unpack(">BI", buf[:5])
            if len(buf) < 5 + size:
                break
            yield flags, json.loads(buf[5 : 5 + size] or b"{}")
            buf = buf[5 + size :]
