"""The file-API audit: every file operation that reaches a sandbox through the data plane (envd's
``/files`` and Filesystem service) is recorded outside the sandbox, in ``data_dir/audit/files``.

The record is made from what crossed the proxy: the operation and paths as the client asked for
them (request line, query, the first bytes of a Connect body) and the outcome as the agent
answered it (status, or the error of a stream's end message). The agent authorizes each
operation against the sandbox's file view (runtime ``FileView``); a refusal is recorded with
``decision: "denied"`` and the rule. Contents are never recorded.
"""

from __future__ import annotations

import base64
import json
import struct
import time
from typing import Any
from urllib.parse import parse_qsl

from sandhold.agent.view import DENIED_MARK
from sandhold.audit import FILE_FIELDS, AuditLog, files_dir
from sandhold.runtime.records import session_of
from sandhold.service import Sandbox

FILESYSTEM = "/filesystem.Filesystem/"
HEAD = 64 * 1024  # enough of a request body for its paths, of a response for its error
CONNECT_STATUS = {
    "permission_denied": 403,
    "not_found": 404,
    "invalid_argument": 400,
    "already_exists": 409,
    "unauthenticated": 401,
}


def file_op(method: str, path: str) -> str | None:
    """The operation a data-plane request is, or None if it is no file operation."""
    if path == "/files":
        return {"GET": "download", "POST": "upload"}.get(method)
    if path.startswith(FILESYSTEM):
        return path.removeprefix(FILESYSTEM)
    return None


class FileOpRecord:
    """One operation as it passes through the proxy: feed it the request and response bytes."""

    def __init__(self, scope: dict[str, Any], sbx: Sandbox, op: str) -> None:
        self.t0 = time.monotonic()
        self.op = op
        self.query = dict(parse_qsl(scope["query_string"].decode("latin-1")))
        self.headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        self.sbx = sbx
        self.request_head = b""
        self.response_head = b""
        self.bytes_in = 0
        self.bytes_out = 0
        self.status: int | None = None
        self.content_type = ""
        self.content_length: int | None = None
        self.written = False

    def request_body(self, data: bytes) -> None:
        self.bytes_in += len(data)
        if len(self.request_head) < HEAD:
            self.request_head += data[: HEAD - len(self.request_head)]

    def response_start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        fields = dict(headers)
        self.content_type = fields.get(b"content-type", b"").decode("latin-1")
        length = fields.get(b"content-length")
        self.content_length = int(length) if length and length.isdigit() else None

    def response_body(self, data: bytes, more: bool) -> bool:
        """Take a piece of the response; True when it completes it for the client (which, with
        a Content-Length, may be before the final empty message)."""
        self.bytes_out += len(data)
        if len(self.response_head) < HEAD:
            self.response_head += data[: HEAD - len(self.response_head)]
        return not more or (
            self.content_length is not None and self.bytes_out >= self.content_length
        )

    # -- what it was ----------------------------------------------------------------------------
    def _user(self) -> str | None:
        if "username" in self.query:
            return self.query["username"]
        auth = self.headers.get("authorization", "")
        if auth.lower().startswith("basic "):
            try:
                return base64.b64decode(auth[6:]).decode().split(":", 1)[0] or None
            except ValueError:
                return None
        return None

    def _request_message(self) -> dict[str, Any]:
        body = self.request_head
        if self.headers.get("content-type", "").startswith("application/connect+json"):
            body = body[5:]  # one enveloped message: flags (1) and length (4)
        return _json(body)

    def _outcome(self) -> tuple[int | None, str | None]:
        """(status, error message) as the agent answered; a Connect stream ends with its error."""
        status = self.status
        body = self.response_head
        if status == 200 and self.content_type.startswith("application/connect+json"):
            while len(body) >= 5:
                flags, size = struct.unpack(">BI", body[:5])
                payload, body = body[5 : 5 + size], body[5 + size :]
                if flags & 0x02:
                    err = _json(payload).get("error") or {}
                    if err:
                        return CONNECT_STATUS.get(str(err.get("code")), 500), str(
                            err.get("message")
                        )
            return status, None
        if status is not None and status >= 400:
            return status, str(_json(body).get("message") or "")[:500] or None
        return status, None

    def records(self) -> list[dict[str, Any]]:
        status, error = self._outcome()
        decision = "allowed" if status is not None and status < 400 else "failed"
        if status == 403 and error and DENIED_MARK in error:
            decision = "denied"
        base = {
            "sandbox": self.sbx.id,
            "team": self.sbx.owner,
            "session": session_of(self.sbx.info.metadata),
            "op": self.op,
            "user": self._user(),
            "status": status,
            "decision": decision,
            "reason": error,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "duration_ms": round((time.monotonic() - self.t0) * 1000, 2),
        }
        if self.op in ("download", "upload"):
            paths = [self.query.get("path")]
            if self.op == "upload" and decision == "allowed":
                written = _json_list(self.response_head)
                paths = [str(e.get("path")) for e in written if isinstance(e, dict)] or paths
            return [{**base, "path": p} for p in paths]
        msg = self._request_message()
        path = msg.get("path", msg.get("source"))
        return [{**base, "path": path, "destination": msg.get("destination")}]


class FileAudit:
    def __init__(self, data_dir: Any) -> None:
        self.log = AuditLog(files_dir(data_dir), FILE_FIELDS)

    def write(self, record: FileOpRecord) -> None:
        if record.written:
            return
        record.written = True
        for rec in record.records():
            self.log.write(rec)

    def close(self) -> None:
        self.log.close()


def _json(data: bytes) -> dict[str, Any]:
    value = _loads(data)
    return value if isinstance(value, dict) else {}


def _json_list(data: bytes) -> list[Any]:
    value = _loads(data)
    return value if isinstance(value, list) else []


def _loads(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None
