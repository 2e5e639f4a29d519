"""Directories a piece of work builds in before it renames the result into place (a template's,
a layer's, a pulled image's), named after the process that made them: ``<prefix><pid>-<start>-``
and a random tail, the pid's start time telling it apart from a later process that reuses the
pid. Work that fails removes its own at once; a sweep removes those whose maker is gone (a
crash, a kill), whatever their age and owner, and never one whose maker still runs.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from sandhold.runtime import safefs


def start_time(pid: int) -> str | None:
    """A process's start time (clock ticks since boot): with the pid, it names one process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[19]
    except (FileNotFoundError, IndexError):
        return None


def make(parent: Path, prefix: str) -> Path:
    """A new directory under ``parent`` (made if missing) that ``sweep`` knows as this
    process's."""
    parent.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    return Path(tempfile.mkdtemp(dir=parent, prefix=f"{prefix}{pid}-{start_time(pid)}-"))


def alive(name: str, prefix: str) -> bool:
    """Whether the process that made staging directory ``name`` still runs."""
    pid, _, rest = name[len(prefix) :].partition("-")
    start, _, _tail = rest.partition("-")
    return pid.isdigit() and start_time(int(pid)) == start


def sweep(parent: Path, prefixes: Iterable[str]) -> int:
    """Remove the staging directories under ``parent`` whose maker is gone (or that name no
    maker: made before makers were named); returns how many."""
    removed = 0
    try:
        entries = list(os.scandir(parent))
    except FileNotFoundError:
        return 0
    for e in entries:
        prefix = next((p for p in prefixes if e.name.startswith(p)), None)
        if prefix is not None and not alive(e.name, prefix):
            removed += safefs.remove_quietly(e.path)
    return removed
