"""A reflecting upstream for the credential-custody tests: ``/reflect/<mode>`` on the test
internet's servers hands the request's ``Authorization`` back in the place ``mode`` names, written
as raw bytes (status line, header names, 1xx, trailers, compressed or encoded bodies, split
chunks, malformed lines), as a hostile or merely careless API would."""

from __future__ import annotations

import base64
import gzip
import zlib
from http.server import BaseHTTPRequestHandler
from urllib.parse import quote

import brotli
from backports import zstd

REMEMBERED: dict[str, str] = {}  # /reflect/remember then /reflect/recall


def encodings(auth: bytes) -> dict[str, bytes]:
    """The credential as the encodings under test, each inside a longer text."""
    body = b"authorization: " + auth
    return {
        "base64": b"\n".join(base64.b64encode(b"x" * i + body) for i in range(3)),
        "base64url": b"\n".join(base64.urlsafe_b64encode(b"xy" * i + body) for i in range(3)),
        "hex": body.hex().encode() + b"\n" + body.hex().upper().encode(),
        "percent": quote(body, safe="").encode() + b"\n" + quote(body, safe="").lower().encode(),
        "percent-all": "".join(f"%{c:02X}" for c in auth).encode(),
        "json-escaped": b'{"a":"' + "".join(f"\\u{c:04x}" for c in auth).encode() + b'"}',
        "html-entities": "".join(f"&#{c};" for c in auth).encode(),
    }


def compress(coding: str, data: bytes) -> bytes:
    if coding == "gzip":
        return gzip.compress(data)
    if coding == "deflate":
        return zlib.compress(data)
    if coding == "br":
        return brotli.compress(data)
    if coding == "zstd":
        return zstd.compress(data)
    if coding == "gzip, br":
        return brotli.compress(gzip.compress(data))
    raise ValueError(coding)


def _response(status: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    head = f"HTTP/1.1 {status}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers)
    return (head + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


def _chunked(status: str, chunks: list[bytes], trailer: bytes = b"") -> bytes:
    out = f"HTTP/1.1 {status}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".encode()
    for c in chunks:
        out += f"{len(c):x}\r\n".encode() + c + b"\r\n"
    return out + b"0\r\n" + trailer + b"\r\n"


def reflect(h: BaseHTTPRequestHandler, mode: str, query: dict[str, list[str]]) -> None:
    auth = h.headers.get("Authorization") or ""
    raw = auth.encode("latin-1")
    token = auth.split(" ")[-1]
    echo = b"authorization: " + raw + b"\n"
    parts: list[bytes]
    if mode == "status":
        parts = [_response(f"200 Reflected {auth}", [], b"ok")]
    elif mode == "header-name":
        parts = [_response("200 OK", [(f"X-R-{token}", "1")], b"ok")]
    elif mode == "header-value":
        parts = [
            _response("200 OK", [("X-Echo", auth), ("Location", f"/?t={quote(token)}")], b"ok")
        ]
    elif mode == "informational":
        early = f"HTTP/1.1 103 {auth}\r\nLink: <{auth}>\r\nX-{token}: 1\r\n\r\n".encode()
        parts = [early, _response("200 OK", [], b"ok")]
    elif mode == "trailer":
        parts = [_chunked("200 OK", [b"ok"], f"X-Echo: {auth}\r\nX-{token}: 1\r\n".encode())]
    elif mode.startswith("compressed-"):
        coding = mode.removeprefix("compressed-").replace("+", ", ")
        parts = [_response("200 OK", [("Content-Encoding", coding)], compress(coding, echo))]
    elif mode == "negotiated":  # compressed only when the request asks for it
        wants = "gzip" in (h.headers.get("Accept-Encoding") or "")
        hdrs = [("Content-Encoding", "gzip")] if wants else []
        parts = [_response("200 OK", hdrs, gzip.compress(echo) if wants else echo)]
    elif mode == "split":  # one byte per chunk, the plain value and its base64
        data = echo + base64.b64encode(b"x" + echo)
        parts = [_chunked("200 OK", [data[i : i + 1] for i in range(len(data))])]
    elif mode.startswith("encoded-"):
        parts = [_response("200 OK", [], encodings(raw)[mode.removeprefix("encoded-")])]
    elif mode == "range":  # honours a Range request, as static file servers do
        rng = h.headers.get("Range")
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            part = echo[int(a) : int(b) + 1]
            parts = [_response("206 Partial Content", [("Content-Range", rng)], part)]
        else:
            parts = [_response("200 OK", [], echo)]
    elif mode == "malformed-status":
        parts = [f"HTTP/1.1 20 {auth}\r\nContent-Length: 0\r\n\r\n".encode()]
    elif mode == "malformed-header":
        parts = [f"HTTP/1.1 200 OK\r\nX\x01{token}: 1\r\nContent-Length: 0\r\n\r\n".encode()]
    elif mode == "malformed-chunk":
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        parts = [head + b"2\r\nok\r\n", f"{token}\r\n".encode()]
    elif mode == "unscannable":
        parts = [_response("200 OK", [("Content-Encoding", "compress")], echo)]
    elif mode == "bad-gzip":
        parts = [_response("200 OK", [("Content-Encoding", "gzip")], b"\x1f\x8bnot gzip" + echo)]
    elif mode == "bomb":  # a few MiB that inflate to ``mib`` MiB of zeros, then the echo
        mib = int(query.get("mib", ["64"])[0])
        c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        body = b"".join(c.compress(b"\0" * (1 << 20)) for _ in range(mib))
        body += c.compress(echo) + c.flush()
        parts = [_response("200 OK", [("Content-Encoding", "gzip")], body)]
    elif mode == "remember":
        REMEMBERED["auth"] = auth
        parts = [_response("200 OK", [], b"remembered")]
    elif mode == "recall":
        parts = [_response("200 OK", [], REMEMBERED.get("auth", "").encode())]
    else:
        parts = [_response("404 Not Found", [], b"no such mode")]
    for p in parts:  # each its own write, so the proxy sees them in separate reads too
        h.wfile.write(p)
        h.wfile.flush()
    h.close_connection = True
