"""Reading the JSON-lines files back (``sandhold logs``): every component's files in order (the
oldest rotated one first, the current one last), merged by time, filtered; ``follow`` tails them
across rotations. A line that is not a JSON object with a ``ts`` is counted and skipped."""

from __future__ import annotations

import datetime as dt
import heapq
import json
import os
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from sandhold.logs.setup import SUFFIX, timestamp

LEVELS = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40, "CRITICAL": 50}
RELATIVE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d)$")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

Record = dict[str, Any]
Entry = tuple[Record, str]  # the record and its line as written


def parse_time(value: str, now: float | None = None) -> str:
    """``value`` (ISO 8601, UTC unless it says otherwise, or relative: ``90s``, ``10m``, ``2h``,
    ``1d`` ago) as a line's ``ts``, to compare with. Raises ``ValueError``."""
    value = value.strip()
    if m := RELATIVE_RE.match(value):
        ago = float(m.group(1)) * UNITS[m.group(2)]
        return timestamp((time.time() if now is None else now) - ago)
    try:
        t = dt.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"invalid time {value!r}: expected ISO 8601 (2025-01-31T12:00:00, UTC unless it "
            "has an offset) or a time ago (90s, 10m, 2h, 1d)"
        ) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return timestamp(t.timestamp())


@dataclass
class Filter:
    min_level: int = 0
    request: str | None = None
    tenant: str | None = None
    session: str | None = None
    sandbox: str | None = None
    since: str | None = None  # ts, inclusive
    until: str | None = None  # ts, inclusive
    grep: str | None = None  # case-insensitive, anywhere in the line

    def match(self, rec: Record, line: str) -> bool:
        if self.min_level and LEVELS.get(str(rec.get("level")), 0) < self.min_level:
            return False
        for key, want in (
            ("request_id", self.request),
            ("tenant", self.tenant),
            ("session", self.session),
            ("sandbox", self.sandbox),
        ):
            if want is not None and rec.get(key) != want:
                return False
        ts = rec["ts"]
        if (self.since is not None and ts < self.since) or (
            self.until is not None and ts > self.until
        ):
            return False
        return self.grep is None or self.grep.lower() in line.lower()


def components(log_dir: Path) -> list[str]:
    """The components that have a current file in ``log_dir`` (``server``, ``gateway``)."""
    try:
        names = os.listdir(log_dir)
    except FileNotFoundError:
        return []
    return sorted(n.removesuffix(SUFFIX) for n in names if n.endswith(SUFFIX))


def files(log_dir: Path, component: str) -> list[Path]:
    """A component's files, oldest first: ``.jsonl.N`` ... ``.jsonl.1``, then ``.jsonl``."""
    current = log_dir / f"{component}{SUFFIX}"
    rotated: list[tuple[int, Path]] = []
    prefix = current.name + "."
    for name in os.listdir(log_dir) if log_dir.is_dir() else []:
        number = name.removeprefix(prefix)
        if name.startswith(prefix) and number.isdigit():
            rotated.append((int(number), log_dir / name))
    return [p for _, p in sorted(rotated, reverse=True)] + [current]


class Lines:
    """Parses lines into records, counting the malformed ones (``skipped``)."""

    def __init__(self) -> None:
        self.skipped = 0

    def parse(self, raw: bytes) -> Entry | None:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line.strip():
            return None
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if not isinstance(rec, dict) or not isinstance(rec.get("ts"), str):
            self.skipped += 1
            return None
        return rec, line


class Tail:
    """One component's current file, read as it grows; reopened when it is rotated (its name
    then holds a new file) or truncated."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.f: BinaryIO | None = None
        self.ino = -1
        self.buf = b""

    def _open(self) -> bool:
        try:
            self.f = open(self.path, "rb")  # noqa: SIM115 (kept open across calls)
        except FileNotFoundError:
            return False
        self.ino = os.fstat(self.f.fileno()).st_ino
        return True

    def read(self, partial: bool = False) -> list[bytes]:
        """The complete lines written since the last call (and an unterminated last one if
        ``partial``: a file that no one writes any more)."""
        out: list[bytes] = []
        if self.f is None and not self._open():
            return out
        for _ in range(2):  # the file, then the one that replaced it
            assert self.f is not None
            data = self.f.read()
            self.buf += data
            *lines, self.buf = self.buf.split(b"\n")
            out.extend(lines)
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                break
            if st.st_ino == self.ino:
                if st.st_size < self.f.tell():  # truncated
                    self.f.seek(0)
                    self.buf = b""
                break
            self.f.close()  # rotated: what was left of it is read; now the new file
            if not self._open():
                break
        if partial and self.buf:
            out.append(self.buf)
            self.buf = b""
        return out

    def close(self) -> None:
        if self.f is not None:
            self.f.close()


def _file_entries(path: Path, lines: Lines) -> Iterator[Entry]:
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed below; a generator's with would pin it)
    except FileNotFoundError:
        return
    with f:
        for raw in f:
            if (entry := lines.parse(raw)) is not None:
                yield entry


def _component_entries(
    log_dir: Path, component: str, lines: Lines, tail: Tail | None
) -> Iterator[Entry]:
    *rotated, current = files(log_dir, component)
    for p in rotated:
        yield from _file_entries(p, lines)
    if tail is None:
        yield from _file_entries(current, lines)
        return
    for raw in tail.read():
        if (entry := lines.parse(raw)) is not None:
            yield entry


def read(
    log_dir: Path,
    names: Iterable[str],
    flt: Filter,
    lines: Lines,
    tails: dict[str, Tail] | None = None,
) -> Iterator[Entry]:
    """The matching entries of the components ``names``, in time order. With ``tails`` (one per
    component) the current files are read through them, which ``follow`` then goes on reading."""
    streams = [_component_entries(log_dir, n, lines, tails[n] if tails else None) for n in names]
    for rec, line in heapq.merge(*streams, key=lambda e: e[0]["ts"]):
        if flt.match(rec, line):
            yield rec, line


def follow(
    log_dir: Path,
    tails: dict[str, Tail],
    flt: Filter,
    lines: Lines,
    poll_s: float = 0.25,
    new_components: bool = True,
) -> Iterator[Entry]:
    """What is written from now on (until the caller stops), in the order each poll finds it
    (by time within a poll). A component whose file appears later is picked up too, unless
    ``new_components`` is false (components were chosen)."""
    while True:
        if new_components:
            for name in components(log_dir):
                if name not in tails:
                    tails[name] = Tail(log_dir / f"{name}{SUFFIX}")
        batch: list[Entry] = []
        for tail in tails.values():
            for raw in tail.read():
                if (entry := lines.parse(raw)) is not None and flt.match(*entry):
                    batch.append(entry)
        batch.sort(key=lambda e: e[0]["ts"])
        yield from batch
        time.sleep(poll_s)
