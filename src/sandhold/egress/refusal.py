"""How the egress proxy says no: a refusal names the HTTP status the client gets, the reason it
is told and the rule the audit log records; ``reply`` and ``framed_reply`` write it as a
plain-text response that names the rule."""

from __future__ import annotations

import h11


class Refused(Exception):
    """Answer the client with ``status`` and a plain reason, and record it."""

    def __init__(self, status: int, reason: str, rule: str = "") -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.rule = rule


def reply(e: Refused) -> bytes:
    """The refusal as raw bytes, for a client whose request h11 could not frame or answer."""
    body = f"sandhold egress proxy: {e.reason}\n".encode()
    head = [
        f"HTTP/1.1 {e.status} {phrase(e.status)}",
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Connection: close",
        "X-Sandhold-Egress: denied" if e.status == 403 else "X-Sandhold-Egress: error",
    ]
    if e.rule:
        head.append("X-Sandhold-Egress-Rule: " + e.rule.replace("\r", "").replace("\n", ""))
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def framed_reply(conn: h11.Connection, e: Refused) -> bytes:
    """The refusal as the response to ``conn``'s current request (inside an intercepted tunnel,
    where h11 frames the responses)."""
    body = f"sandhold egress proxy: {e.reason}\n".encode()
    out = conn.send(
        h11.Response(
            status_code=e.status,
            headers=[
                ("Content-Type", "text/plain; charset=utf-8"),
                ("Content-Length", str(len(body))),
                ("Connection", "close"),
                ("X-Sandhold-Egress", "denied" if e.status == 403 else "error"),
            ],
            reason=phrase(e.status).encode(),
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
