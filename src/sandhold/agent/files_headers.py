"""The header values of ``/files``: parameters parsed as Go's mime package does, ``X-Metadata-*``
on uploads, Accept-Encoding negotiation, and a download's Content-Type and Content-Disposition.
"""

from __future__ import annotations

import posixpath
import re
import time

from .http import HttpError, Request, percent_decode, percent_encode

METADATA_HEADER = "x-metadata-"
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_PRINTABLE = re.compile(r"^[\x20-\x7e]*$")

_CONTENT_TYPES = {
    ".txt": "text/plain; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".htm": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".csv": "text/csv; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".json": "application/json",
    ".xml": "text/xml; charset=utf-8",
    ".md": "text/markdown; charset=utf-8",
    ".py": "text/x-python; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".pdf": "application/pdf",
    ".zip": "application/zip",
    ".gz": "application/gzip",
    ".tar": "application/x-tar",
    ".wasm": "application/wasm",
}


def upload_metadata(req: Request) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in req.headers:
        if name.startswith(METADATA_HEADER):
            key = name[len(METADATA_HEADER) :]
            value = req.header(name)
            if not key or not _TOKEN.match(key):
                raise HttpError(400, f"invalid metadata key {key!r}")
            if not _PRINTABLE.match(value):
                raise HttpError(400, f"invalid metadata value for key {key!r}")
            out[key] = value
    return out


def wants_gzip(req: Request) -> bool:
    """envd's Accept-Encoding negotiation: gzip if acceptable and preferred over identity;
    Range and conditional requests always get identity."""
    header = req.header("accept-encoding")
    if not header or any(
        req.header(h) for h in ("range", "if-modified-since", "if-none-match", "if-range")
    ):
        return False
    prefs: list[tuple[float, str]] = []
    for item in header.split(","):
        name, params = parse_header_value(item)
        try:
            q = float(params.get("q", "1"))
        except ValueError:
            q = 1.0
        prefs.append((q, name.lower()))
    prefs.sort(key=lambda p: -p[0])
    identity_rejected = any(n == "identity" and q == 0 for q, n in prefs)
    for q, name in prefs:
        if q == 0:
            continue
        if name == "identity":
            return False
        if name == "*":
            return identity_rejected
        if name == "gzip":
            return True
    if identity_rejected:
        raise HttpError(406, "no acceptable encoding found, supported: [gzip]")
    return False


def content_type(path: str) -> str:
    return _CONTENT_TYPES.get(posixpath.splitext(path)[1].lower(), "application/octet-stream")


def content_disposition(name: str) -> str:
    ascii_name = name.encode("ascii", "replace").decode().replace("\\", "\\\\").replace('"', '\\"')
    value = f'inline; filename="{ascii_name}"'
    if not name.isascii():
        value += f"; filename*=UTF-8''{percent_encode(name)}"
    return value


def http_date(ts: float) -> str:
    return time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(ts))


def parse_header_value(value: str) -> tuple[str, dict[str, str]]:
    """``type/sub; a=b; c="d \\"e\\""`` → ("type/sub", {"a": "b", "c": 'd "e"'}).

    Quoted strings keep backslash escapes like Go's mime package; ``name*=UTF-8''…`` values
    (RFC 5987) are percent-decoded into ``name``."""
    main, _, rest = value.partition(";")
    params: dict[str, str] = {}
    i, n = 0, len(rest)
    while i < n:
        while i < n and rest[i] in " \t;":
            i += 1
        start = i
        while i < n and rest[i] not in "=;":
            i += 1
        key = rest[start:i].strip().lower()
        if i >= n or rest[i] == ";":
            continue
        i += 1  # '='
        while i < n and rest[i] in " \t":
            i += 1
        if i < n and rest[i] == '"':
            i += 1
            buf = []
            while i < n and rest[i] != '"':
                if rest[i] == "\\" and i + 1 < n:
                    i += 1
                buf.append(rest[i])
                i += 1
            i += 1
            val = "".join(buf)
        else:
            start = i
            while i < n and rest[i] != ";":
                i += 1
            val = rest[start:i].strip()
        if key.endswith("*"):
            charset, _, encoded = val.partition("'")
            _, _, encoded = encoded.partition("'")
            try:
                params[key[:-1]] = percent_decode(encoded, encoding=charset or "utf-8")
            except LookupError:
                pass
        elif key and key not in params:
            params[key] = val
    return main.strip(), params
