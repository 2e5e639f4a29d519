"""A sandbox's log (``sandbox.log`` in its directory: what its agent wrote, agent/log.py: its
own events, each process started and ended, each line its template's services printed), read
back as entries for E2B's ``GET /sandboxes/{id}/logs`` (e2b/sandbox_logs.py).

A line is ``<UTC time> sandhold-agent: LEVEL message``; anything else in the file (a traceback,
what a tool wrote before the agent ran) is an entry of its own at the time of the line before it.
Only the file's last ``READ_MAX`` bytes are read.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

FILE = "sandbox.log"
READ_MAX = 16 << 20
LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) sandhold-agent: (\w+) (.*)$")
LEVELS = {"DEBUG": "debug", "INFO": "info", "WARNING": "warn", "ERROR": "error"}
ORDER = {"debug": 0, "info": 1, "warn": 2, "error": 3}


@dataclass(frozen=True)
class Entry:
    at_ms: int
    level: str  # debug | info | warn | error
    message: str


def read(sandbox_dir: Path, since_ms: int) -> list[Entry]:
    """The log's entries, oldest first, from ``since_ms`` (UTC ms) on; none if it has none."""
    try:
        fd = os.open(sandbox_dir / FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(max(0, size - READ_MAX))
        data = f.read(READ_MAX)
    if size > READ_MAX:  # (the first line read is a piece of one)
        data = data.partition(b"\n")[2]
    out: list[Entry] = []
    at_ms = since_ms
    for raw in data.decode(errors="replace").splitlines():
        m = LINE.match(raw)
        if m is not None:
            at = datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
            at_ms = int(at.timestamp() * 1000)
            level, message = LEVELS.get(m.group(2), "info"), m.group(3)
        elif raw.strip():
            level, message = "info", raw
        else:
            continue
        if at_ms >= since_ms:
            out.append(Entry(at_ms, level, message))
    return out


def at_least(entries: list[Entry], level: str | None) -> list[Entry]:
    if level is None:
        return entries
    floor = ORDER[level]
    return [e for e in entries if ORDER[e.level] >= floor]
