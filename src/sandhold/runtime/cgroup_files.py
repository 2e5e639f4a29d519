"""What both cgroup backends share: the files' reads and writes, and ``Group``, the interface
of one sandbox's cgroups that everything above the cgroup layer uses."""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000


def write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def read(path: Path) -> str:
    return read_proc(str(path)).decode()


def read_proc(path: str) -> bytes:
    """A small file of /proc or /sys, unbuffered: a listing reads two for every sandbox, and
    ``open()``'s file object costs several times the read itself."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = b""
        while chunk := os.read(fd, 65536):
            data += chunk
        return data
    finally:
        os.close(fd)


def remove_group(d: Path) -> None:
    """Remove an empty group, waiting out a dying task that keeps it busy for a moment."""
    for _ in range(200):
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.005)


class Group(ABC):
    """One sandbox's cgroups, in whichever hierarchy the host has."""

    name: str
    parent: str  # one parent group per runtime data dir, so runtimes never touch each other

    @abstractmethod
    def dirs(self) -> list[Path]:
        """Its directories, one per hierarchy."""

    @abstractmethod
    def create(self, memory_mb: int, cpu: float, pids: int) -> None:
        """Make the groups (or set new limits on them): memory without swap, CPU, pids."""

    @abstractmethod
    def add(self, pid: int) -> None:
        """Move a process (0: the caller) into the sandbox's groups."""

    @abstractmethod
    def procs_files(self) -> list[str]:
        """Its ``cgroup.procs`` files: what a process joining it writes itself to."""

    @abstractmethod
    def pids(self) -> list[int]:
        """The pids in it that this process can see (never 0: a task of another namespace)."""

    @abstractmethod
    def exists(self) -> bool: ...

    @abstractmethod
    def populated(self) -> bool:
        """Whether any process is in it, seen from any PID namespace."""

    @abstractmethod
    def freeze(self) -> None:
        """Freeze every task, and return once they are frozen."""

    @abstractmethod
    def thaw(self) -> None: ...

    @abstractmethod
    def frozen(self) -> bool: ...

    @abstractmethod
    def freezer_dir(self) -> Path:
        """The group CRIU freezes and dumps through (``--freeze-cgroup``)."""

    @abstractmethod
    def kill_all(self, timeout: float = 10.0) -> None:
        """Kill every process of the sandbox, frozen or not, and wait until none is left."""

    @abstractmethod
    def remove(self) -> None: ...

    @abstractmethod
    def usage(self) -> dict[str, int]:
        """cpu_ns, memory_bytes, memory_cache_bytes, memory_rss_bytes, memory_limit_bytes,
        oom_kills, pids."""

    @abstractmethod
    def oom_kills(self) -> int:
        """OOM kills inside the sandbox (OSError: the group is gone)."""
