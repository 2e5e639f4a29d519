"""An incremental multipart/form-data parser for ``POST /files``: a part's content streams
through in pieces, so an upload never has to fit in memory."""

from __future__ import annotations

from typing import Any

from .http import HttpError

MAX_PART_HEADERS = 16 << 10


class MultipartParser:
    """Incremental multipart/form-data parser.

    ``feed`` returns events: ``("part", headers)`` when a part starts, ``("data", bytes)`` for
    its content, ``("end", None)`` when it ends. Memory stays bounded by the chunk size.
    """

    def __init__(self, boundary: bytes) -> None:
        self._dash = b"--" + boundary
        self._delim = b"\r\n--" + boundary
        self._buf = bytearray()
        self._state = "preamble"

    def feed(self, data: bytes, final: bool = False) -> list[tuple[str, Any]]:
        self._buf += data
        events: list[tuple[str, Any]] = []
        while True:
            if self._state == "preamble":
                idx = self._buf.find(self._dash)
                if idx < 0:
                    keep = len(self._dash) - 1
                    if len(self._buf) > keep:
                        del self._buf[: len(self._buf) - keep]
                    break
                del self._buf[: idx + len(self._dash)]
                self._state = "delimiter"
            elif self._state == "delimiter":
                stripped = self._buf.lstrip(b" \t")
                if len(stripped) < 2:
                    break
                if stripped[:2] == b"--":
                    self._state = "done"
                    self._buf.clear()
                    break
                if stripped[:2] != b"\r\n":
                    raise HttpError(400, "error reading form: malformed multipart boundary")
                del self._buf[: len(self._buf) - len(stripped) + 2]
                self._state = "headers"
            elif self._state == "headers":
                if self._buf.startswith(b"\r\n"):
                    head, end = b"", 2
                else:
                    idx = self._buf.find(b"\r\n\r\n")
                    if idx < 0:
                        if len(self._buf) > MAX_PART_HEADERS:
                            raise HttpError(400, "error reading form: part headers too large")
                        break
                    head, end = bytes(self._buf[:idx]), idx + 4
                del self._buf[:end]
                headers: dict[str, str] = {}
                for line in head.split(b"\r\n"):
                    name, sep, value = line.partition(b":")
                    if sep:
                        headers[name.strip().decode("latin-1").lower()] = value.strip().decode(
                            "utf-8", "surrogateescape"
                        )
                events.append(("part", headers))
                self._state = "body"
            elif self._state == "body":
                idx = self._buf.find(self._delim)
                if idx < 0:
                    keep = len(self._delim) - 1
                    if len(self._buf) > keep:
                        events.append(("data", bytes(self._buf[: len(self._buf) - keep])))
                        del self._buf[: len(self._buf) - keep]
                    break
                if idx:
                    events.append(("data", bytes(self._buf[:idx])))
                events.append(("end", None))
                del self._buf[: idx + len(self._delim)]
                self._state = "delimiter"
            else:  # done: ignore the epilogue
                self._buf.clear()
                break
        if final and self._state != "done":
            raise HttpError(400, "error reading form: unexpected EOF")
        return events
