"""Connect's streamed framing as the data plane meets it (``[flags][length][message]``
envelopes): passing a stream's envelopes on whole, ending one early or at once with an error,
and reading the env of a command's Start request."""

from __future__ import annotations

import gzip
import io
import json
import struct
from typing import Any

from sandhold.envd.framing import END_STREAM, envelope
from sandhold.errors import InvalidRequest

Send = Any


class Envelopes:
    """The Connect envelopes of a streamed response (``[flags][length][message]``), passed on
    whole and only whole: a stream whose sandbox goes away mid-way can then still end with a
    valid end-of-stream envelope."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.ended = False  # the end-of-stream envelope went through

    def feed(self, data: bytes) -> bytes:
        """``data`` appended; returns the envelopes now complete, keeps the rest."""
        self.buf += data
        whole = 0
        while len(self.buf) - whole >= 5:
            flags, size = struct.unpack_from(">BI", self.buf, whole)
            if len(self.buf) - whole - 5 < size:
                break
            self.ended = self.ended or bool(flags & END_STREAM)
            whole += 5 + size
        out = bytes(self.buf[:whole])
        del self.buf[:whole]
        return out


def start_envs(body: bytes, headers: dict[bytes, bytes], limit: int) -> dict[str, str] | None:
    """``process.envs`` of a Start request (one Connect envelope of JSON), or None when it is
    not one the agent could read either (the agent then says what is wrong)."""
    if len(body) < 5:
        return None
    flags, size = struct.unpack_from(">BI", body)
    payload = body[5 : 5 + size]
    try:
        if flags & 0x01 and headers.get(b"connect-content-encoding") == b"gzip":
            with gzip.GzipFile(fileobj=io.BytesIO(payload)) as z:
                payload = z.read(limit + 1)
            if len(payload) > limit:
                raise InvalidRequest(
                    f"the request is over {limit} bytes uncompressed (setting "
                    "server_max_body_bytes)"
                )
        msg = json.loads(payload)
    except (OSError, EOFError, ValueError):
        return None
    proc = msg.get("process") if isinstance(msg, dict) else None
    envs = proc.get("envs") if isinstance(proc, dict) else None
    if not isinstance(envs, dict):
        return None
    return {str(k): str(v) for k, v in envs.items()}


async def send_stream_error(send: Send, code: str, message: str) -> None:
    """A Connect server stream that ends at once with an error (HTTP 200, as envd's)."""
    body = envelope({"error": {"code": code, "message": message}}, END_STREAM)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/connect+json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
