"""Audit logs: one JSON line per event, in a file per UTC day under a directory, written with a
single ``write`` on an ``O_APPEND`` descriptor (lines never interleave, even across processes).

Three logs use it: the egress log (``data_dir/egress/audit``: requests, tunnels and DNS
questions of sandboxes, see docs/egress.md), the file-API log (``data_dir/audit/files``: every
file operation that reaches a sandbox through the E2B data plane, see docs/security.md) and the
console's actions log (``data_dir/audit/console``: each kill, pause or close an operator asked
for in a console, who asked and how it ended, see docs/console.md). Records never hold header
values, file contents, keys or secrets.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

EGRESS_FIELDS = (
    "ts",
    "sandbox",
    "tenant",
    "session",
    "kind",
    "method",
    "host",
    "port",
    "path",
    "status",
    "bytes_out",
    "bytes_in",
    "decision",
    "rule",
    "reason",
    "injected",
    "duration_ms",
)
FILE_FIELDS = (
    "ts",
    "sandbox",
    "team",
    "session",
    "op",
    "path",
    "destination",
    "user",
    "status",
    "decision",
    "reason",
    "bytes_in",
    "bytes_out",
    "duration_ms",
)

# actor: who asked ("admin", "tenant <name>": a tenant's or a team's key); tenant: whose
# sandbox or session it is; status: done, refused (the caller's mistake: not found, a
# conflict) or failed (ours); reason: what was asked and, unless done, why not.
CONSOLE_FIELDS = (
    "ts",
    "actor",
    "tenant",
    "action",
    "sandbox",
    "session",
    "status",
    "reason",
)


def _day(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d")


class AuditLog:
    def __init__(self, directory: Path, fields: tuple[str, ...]) -> None:
        self.dir = directory
        self.fields = fields
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._day = ""
        self._fd = -1

    def write(self, record: dict[str, Any]) -> None:
        record.setdefault("ts", time.time())
        day = _day(record["ts"])
        if day != self._day:
            if self._fd >= 0:
                os.close(self._fd)
            self._fd = os.open(
                self.dir / f"{day}.jsonl",
                os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                0o600,
            )
            self._day = day
        line = json.dumps(
            {k: record[k] for k in self.fields if record.get(k) is not None}, separators=(",", ":")
        )
        os.write(self._fd, line.encode() + b"\n")  # one write: lines never interleave

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _lines(directory: Path, since: float | None, until: float | None) -> Iterator[dict[str, Any]]:
    if not directory.is_dir():
        return
    first = _day(since) if since is not None else ""
    last = _day(until) if until is not None else "9999"
    for f in sorted(directory.glob("*.jsonl")):
        if not first <= f.stem <= last:
            continue
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                try:
                    yield json.loads(line)
                except ValueError:
                    continue  # a line cut short by a crash


def query(
    directory: Path,
    *,
    since: float | None = None,
    until: float | None = None,
    limit: int = 1000,
    **match: str | None,
) -> list[dict[str, Any]]:
    """Records (oldest first, at most ``limit``, the latest ones) whose fields equal every
    ``match`` value that is not None."""
    wanted = {k: v for k, v in match.items() if v is not None}
    out: list[dict[str, Any]] = []
    for rec in _lines(directory, since, until):
        ts = rec.get("ts", 0)
        if (since is not None and ts < since) or (until is not None and ts > until):
            continue
        if any(rec.get(k) != v for k, v in wanted.items()):
            continue
        out.append(rec)
        if len(out) > limit:
            out.pop(0)
    return out


def egress_dir(data_dir: Path) -> Path:
    return data_dir / "egress" / "audit"


def files_dir(data_dir: Path) -> Path:
    return data_dir / "audit" / "files"


def console_dir(data_dir: Path) -> Path:
    return data_dir / "audit" / "console"
