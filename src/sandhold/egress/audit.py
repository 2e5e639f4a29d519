"""The egress audit log: one JSON line per request, tunnel or DNS question, in a file per UTC
day under ``data_dir/egress/audit``. Records name hosts, methods, paths, statuses, byte counts
and the rule that decided; never header values or secrets."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

FIELDS = (
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


def _day(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d")


class AuditLog:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
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
            {k: record[k] for k in FIELDS if record.get(k) is not None}, separators=(",", ":")
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
    data_dir: Path,
    *,
    sandbox: str | None = None,
    tenant: str | None = None,
    decision: str | None = None,
    host: str | None = None,
    since: float | None = None,
    until: float | None = None,
    limit: int = 1000,
) -> list[dict[str, Any]]:
    """Audit records (oldest first, at most ``limit``, the latest ones) matching every filter."""
    out: list[dict[str, Any]] = []
    for rec in _lines(data_dir / "egress" / "audit", since, until):
        ts = rec.get("ts", 0)
        if (since is not None and ts < since) or (until is not None and ts > until):
            continue
        if (sandbox and rec.get("sandbox") != sandbox) or (tenant and rec.get("tenant") != tenant):
            continue
        if (decision and rec.get("decision") != decision) or (host and rec.get("host") != host):
            continue
        out.append(rec)
        if len(out) > limit:
            out.pop(0)
    return out
