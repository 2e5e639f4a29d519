"""How the egress proxy says no. A refusal is an ``EgressRefused`` (the error tree's leaf) whose
message is the reason the client is told, with the HTTP status it is answered with and the
rule the audit log records. ``reply`` and ``framed_reply`` write it as a plain-text
response that names the rule."""

from __future__ import annotations

import h11

from sandhold.errors import EgressRefused


def refused(status: int, reason: str, rule: str = "") -> EgressRefused:
    """An ``EgressRefused`` the proxy answers with ``status`` and records under ``rule``."""
    return EgressRefused(reason, status, rule)


def reply(e: EgressRefused) -> bytes:
    """The refusal as raw bytes, for a client whose request h11 could not frame or answer."""
    status, rule = e.status, e.rule
    body = f"sandhold egress proxy: {e.message}\n".encode()
    head = [
        f"HTTP/1.1 {status} {phrase(status)}",
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Connection: close",
        "X-Sandhold-Egress: denied" if status == 403 else "X-Sandhold-Egress: error",
    ]
    if rule:
        head.append("X-Sandhold-Egress-Rule: " + rule.replace("\r", "").replace("\n", ""))
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def framed_reply(conn: h11.Connection, e: EgressRefused) -> bytes:
    """The refusal as the response to ``conn``'s current request (inside an intercepted tunnel,
    where h11 frames the responses)."""
    status = e.status
    body = f"sandhold egress proxy: {e.message}\n".encode()
    out = conn.send(
        h11.Response(
            status_code=status,
            headers=[
                ("Content-Type", "text/plain; charset=utf-8"),
                ("Content-Length", str(len(body))),
                ("Connection", "close"),
                ("X-Sandhold-Egress", "denied" if status == 403 else "error"),
            ],
            reason=phrase(status).encode(),
        )
    )
    return (out or b"") + (conn.send(h11.Data(data=body)) or b"")


def phrase(status: int) -> str:
    return {
        400: "Bad Request",
        403: "Forbidden",
        405: "Method Not Allowed",
        502: "Bad Gateway",
        504: "Gateway Timeout",
    }.get(status, "Error")
