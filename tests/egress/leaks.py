"""What a sandbox received, and whether a credential is in it in any form: a raw client that runs
inside the sandbox (every byte the proxy sent back, status line and framing included), and an
oracle that decodes whatever it can (chunked framing, content codings, URL, JSON and HTML
escapes, base64 and hex runs, UTF-16) and searches each view. It shares no code with the proxy's
scanner, so it checks it rather than repeats it."""

from __future__ import annotations

import base64
import binascii
import gzip
import html
import re
import shlex
import zlib
from urllib.parse import unquote_to_bytes

import brotli
from backports import zstd

from tests.runtime.helpers import sh

# Inside the sandbox: one request through the proxy (CONNECT + TLS for https), every byte back.
FETCH = r"""
import base64, socket, ssl, sys
url, extra = sys.argv[1], sys.argv[2].encode().decode("unicode_escape")
scheme, _, rest = url.partition("://")
host, _, path = rest.partition("/")
s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
if scheme == "https":
    s.sendall(f"CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n\r\n".encode())
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        head += s.recv(1)
    s = ssl.create_default_context().wrap_socket(s, server_hostname=host)
    target = "/" + path
else:
    target = url
s.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nAccept-Encoding: gzip, deflate, br, zstd"
          f"\r\n{extra}Connection: close\r\n\r\n".encode())
out = b""
try:
    while chunk := s.recv(65536):
        out += chunk
except (OSError, ssl.SSLError):
    pass
sys.stdout.write(base64.b64encode(out).decode())
"""


def fetch_command(url: str, extra: str = "") -> str:
    """The shell command that prints (base64) the raw bytes a sandbox gets for ``GET url``
    (``extra``: more header lines, each ending in \\r\\n)."""
    return f"python3 -c {shlex.quote(FETCH)} {shlex.quote(url)} {shlex.quote(extra)}"


async def fetch(sbx, url: str, extra: str = "") -> bytes:
    r = await sh(sbx, fetch_command(url, extra))
    assert r.exit_code == 0, r.stderr.decode()
    return base64.b64decode(r.stdout)


def split(raw: bytes) -> tuple[bytes, bytes]:
    """(head, body) of the final response in ``raw``, the body unchunked and decoded as a client
    would (Content-Encoding undone where it can be)."""
    rest = raw
    while True:
        head, _, rest = rest.partition(b"\r\n\r\n")
        if not re.match(rb"HTTP/1\.[01] 1\d\d", head):
            break
    lines = head.lower().split(b"\r\n")
    body = rest
    if b"transfer-encoding: chunked" in lines:
        body, data = b"", rest
        while data:
            size_line, _, data = data.partition(b"\r\n")
            try:
                n = int(size_line.split(b";")[0], 16)
            except ValueError:
                break
            if n == 0:
                break
            body, data = body + data[:n], data[n + 2 :]
    for line in lines:
        if line.startswith(b"content-encoding:"):
            for coding in reversed(line.split(b":", 1)[1].decode().split(",")):
                body = _decode(coding.strip(), body)
    return head, body


def _decode(coding: str, body: bytes) -> bytes:
    try:
        if coding == "gzip":
            return gzip.decompress(body)
        if coding == "deflate":
            return zlib.decompress(body)
        if coding == "br":
            return brotli.decompress(body)
        if coding == "zstd":
            return zstd.decompress(body)
    except Exception:
        pass
    return body


def _unbackslash(text: str) -> str:
    return re.sub(
        r"\\u([0-9a-fA-F]{4})|\\x([0-9a-fA-F]{2})|\\(.)",
        lambda m: chr(int(m[1] or m[2], 16)) if (m[1] or m[2]) else m[3],
        text,
    )


def _views(data: bytes) -> list[bytes]:
    text = data.decode("latin-1")
    views = [data, unquote_to_bytes(data), unquote_to_bytes(data.replace(b"+", b" "))]
    views.append(html.unescape(text).encode("latin-1", "replace"))
    views.append(_unbackslash(text).encode("latin-1", "replace"))
    every = _unbackslash(html.unescape(unquote_to_bytes(data).decode("latin-1")))
    views.append(every.encode("latin-1", "replace"))  # the escapes of all kinds, mixed
    views.append(data.replace(b"\0", b""))
    for run in re.findall(rb"[A-Za-z0-9+/_-]{8,}", data):
        run = run.replace(b"-", b"+").replace(b"_", b"/")
        for o in range(4):
            part = run[o:]
            part = part[:-1] if len(part) % 4 == 1 else part
            try:
                views.append(base64.b64decode(part + b"=" * (-len(part) % 4)))
            except (binascii.Error, ValueError):
                pass
    for run in re.findall(rb"[0-9a-fA-F]{8,}", data):
        for o in range(2):
            part = run[o:]
            views.append(binascii.unhexlify(part[: len(part) // 2 * 2]))
    return views


def leaked(raw: bytes, secret: str) -> bool:
    """Whether any form of ``secret`` is in ``raw`` (a response as the sandbox got it)."""
    head, body = split(raw)
    needle = secret.encode().lower()
    return any(needle in v.lower() for part in (raw, head, body) for v in _views(part))
