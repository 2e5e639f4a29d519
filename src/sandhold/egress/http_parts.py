"""The parts of HTTP requests the egress proxy reads itself (h11 does the framing): authorities,
header values, origin-form targets, and the hop-by-hop headers that never cross the proxy."""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from sandhold.egress.refusal import refused

HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"proxy-authorization",
    b"proxy-authenticate",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
    b"expect",
    b"content-length",
}


def authority(text: str, default_port: int | None) -> tuple[str, int]:
    """(host, port) of ``host[:port]`` or ``[v6][:port]``, the host lowercase without its
    trailing dot; a 400 refusal if either part is missing or invalid."""
    host, port = text, default_port
    if text.startswith("["):
        end = text.find("]")
        host, rest = text[1:end], text[end + 1 :]
        if rest.startswith(":"):
            port = int(rest[1:]) if rest[1:].isdigit() else -1
    elif text.count(":") == 1:
        host, _, p = text.partition(":")
        port = int(p) if p.isdigit() else -1
    if not host or port is None or not 0 < port < 65536:
        raise refused(400, f"invalid host or port {text!r}")
    return host.rstrip(".").lower(), port


def header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> str | None:
    for k, v in headers:
        if k.lower() == name:
            return v.decode("latin-1")
    return None


def closes(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    value = header(headers, b"connection")
    return value is not None and "close" in value.lower()


def origin_form(target: bytes) -> bytes:
    """Origin form of a request target (absolute URLs lose scheme and authority)."""
    if target.startswith(b"http://") or target.startswith(b"https://"):
        parts = urlsplit(target.decode("ascii", "replace"))
        path = parts.path or "/"
        return (path + ("?" + parts.query if parts.query else "")).encode()
    return target or b"/"
