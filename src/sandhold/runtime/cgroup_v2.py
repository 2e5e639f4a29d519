"""The cgroup v2 backend: hosts that mount the unified hierarchy only (Debian 11 and later,
Ubuntu 22.04 and later, RHEL 9, every systemd >= 258 host, every Kubernetes node).

The server writes only in a subtree it was handed (``root()``):
- under systemd, a scope delegated to it beside its unit (cgroup_scope.py: sandboxes outlive
  the unit's restarts there);
- elsewhere its own cgroup: a container's with a private cgroup namespace (there its own group
  shows as ``/``), or any group a supervisor started it in.
Below a host's root, a group with processes cannot enable controllers for its children ("no
internal processes"), so the group's own processes move first to a leaf (the server's to
``SERVER_LEAF``, the scope's holder to ``HOLDER_LEAF``); then ``memory``, ``pids`` and ``cpu``
are enabled below it and below each data dir's parent group, and a sandbox is
``<root>/<parent>/<id>``.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sandhold.errors import HostUnsupported
from sandhold.runtime import cgroup_scope
from sandhold.runtime.cgroup_files import (
    CGROUP_ROOT,
    CPU_PERIOD_US,
    Group,
    read,
    read_proc,
    remove_group,
    write,
)

CONTROLLERS = ("memory", "pids", "cpu")
SERVER_LEAF = "sandhold-server"
_prepared: set[Path] = set()
_preparing = threading.Lock()


@functools.cache
def own_group() -> Path:
    """The cgroup this process was started in, read once: after the move to the leaf,
    ``/proc/self/cgroup`` names the leaf."""
    path = "/"
    for line in read_proc("/proc/self/cgroup").decode().splitlines():
        if line.startswith("0::"):
            path = line[3:].strip()
    d = CGROUP_ROOT / path.lstrip("/")
    return d.parent if d.name == SERVER_LEAF else d


@functools.cache
def root() -> Path:
    """Where this process makes sandbox groups: the scope of its systemd unit, or its own."""
    return cgroup_scope.scope_for(own_group()) or own_group()


def prepared_root() -> Path:
    """``root()``, made a parent of groups (once per process, again if it went away)."""
    r = root()
    if r in _prepared and r.is_dir():
        return r
    with _preparing:
        if r != own_group():
            if not r.is_dir():
                cgroup_scope.start(r)
            delegate(r, cgroup_scope.HOLDER_LEAF)
        else:
            delegate(r, SERVER_LEAF)
        _prepared.add(r)
    return r


def missing_controllers() -> list[str]:
    """The controllers a sandbox needs that ``root()`` cannot have (a scope not made yet: those
    its slice cannot give it)."""
    r = root()
    return _missing(r if r.is_dir() else r.parent)


def _missing(d: Path) -> list[str]:
    """The controllers a sandbox needs that group ``d`` cannot enable for its children."""
    available = read(d / "cgroup.controllers").split()
    return [c for c in CONTROLLERS if c not in available]


def is_host_root(d: Path) -> bool:
    """The host's root group, the one exempt from "no internal processes" (it has no
    ``cgroup.freeze``; a namespace's root, a real group below, has one)."""
    return not (d / "cgroup.freeze").exists()


def enable(d: Path) -> None:
    """The controllers a sandbox needs, enabled for the children of ``d``."""
    enabled = read(d / "cgroup.subtree_control").split()
    if all(c in enabled for c in CONTROLLERS):
        return
    missing = _missing(d)
    if missing:
        raise HostUnsupported(
            f"cgroup v2 controllers {' '.join(missing)} are not delegated to {d} (in a "
            "container, its cgroup must be delegated to the server: docs/deploy.md)"
        )
    write(d / "cgroup.subtree_control", " ".join(f"+{c}" for c in CONTROLLERS))


def delegate(group: Path, leaf: str) -> None:
    """Make ``group`` a parent of groups: below a host's root, move its processes (every process
    of the unit or container, or the scope's holder) into ``leaf`` first. Idempotent."""
    procs = [] if is_host_root(group) else read(group / "cgroup.procs").split()
    if procs:
        (group / leaf).mkdir(exist_ok=True)
        for pid in procs:
            if int(pid) > 0:  # 0: a task of another PID namespace, which we cannot move
                with contextlib.suppress(ProcessLookupError, OSError):
                    write(group / leaf / "cgroup.procs", pid)
    enable(group)


def _wait_events(d: Path, key: str, want: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while f"{key} {want}" not in read(d / "cgroup.events").splitlines():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{d} did not reach {key} {want}")
        time.sleep(0.0005)


@dataclass(frozen=True)
class V2Group(Group):
    name: str
    parent: str

    @property
    def dir(self) -> Path:
        return root() / self.parent / self.name

    def dirs(self) -> list[Path]:
        return [self.dir]

    def create(self, memory_mb: int, cpu: float, pids: int) -> None:
        parent = prepared_root() / self.parent
        parent.mkdir(exist_ok=True)
        enable(parent)
        d = self.dir
        d.mkdir(exist_ok=True)
        write(d / "memory.max", str(memory_mb << 20))
        if (d / "memory.swap.max").exists():
            write(d / "memory.swap.max", "0")  # never swaps the host to death, as v1's memsw
        write(d / "cpu.max", f"{int(cpu * CPU_PERIOD_US)} {CPU_PERIOD_US}")
        write(d / "pids.max", str(pids))

    def add(self, pid: int) -> None:
        write(self.dir / "cgroup.procs", str(pid))

    def procs_files(self) -> list[str]:
        return [str(self.dir / "cgroup.procs")]

    def pids(self) -> list[int]:
        try:
            text = read_proc(f"{root()}/{self.parent}/{self.name}/cgroup.procs")
        except FileNotFoundError:
            return []
        return [p for p in map(int, text.split()) if p > 0]

    def exists(self) -> bool:
        return self.dir.is_dir()

    def populated(self) -> bool:
        try:
            return "populated 1" in read(self.dir / "cgroup.events").splitlines()
        except FileNotFoundError:
            return False

    def freeze(self) -> None:
        write(self.dir / "cgroup.freeze", "1")
        _wait_events(self.dir, "frozen", "1")

    def thaw(self) -> None:
        write(self.dir / "cgroup.freeze", "0")
        _wait_events(self.dir, "frozen", "0")

    def frozen(self) -> bool:
        return read(self.dir / "cgroup.freeze").strip() == "1"

    def freezer_dir(self) -> Path:
        return self.dir

    def kill_all(self, timeout: float = 10.0) -> None:
        """``cgroup.kill``: the whole tree at once, frozen or not, even one that forks."""
        d = self.dir
        if not d.is_dir():
            return
        deadline = time.monotonic() + timeout
        while "populated 1" in read(d / "cgroup.events").splitlines():
            if time.monotonic() > deadline:
                raise TimeoutError(f"processes of sandbox {self.name} survived cgroup.kill")
            write(d / "cgroup.kill", "1")  # again: a process may have joined meanwhile
            time.sleep(0.001)

    def remove(self) -> None:
        remove_group(self.dir)

    def usage(self) -> dict[str, int]:
        d = self.dir
        cpu = dict(line.split() for line in read(d / "cpu.stat").splitlines())
        mem = dict(line.split() for line in read(d / "memory.stat").splitlines())
        limit = read(d / "memory.max").strip()
        return {
            "cpu_ns": int(cpu["usage_usec"]) * 1000,
            "memory_bytes": int(read(d / "memory.current")),
            "memory_cache_bytes": int(mem.get("file", "0")),
            "memory_rss_bytes": int(mem.get("anon", "0")),
            "memory_limit_bytes": int(limit) if limit.isdigit() else 0,
            "oom_kills": self.oom_kills(),
            "pids": int(read(d / "pids.current")),
        }

    def oom_kills(self) -> int:
        events = dict(line.split() for line in read(self.dir / "memory.events").splitlines())
        return int(events.get("oom_kill", "0"))


def group_dirs(parent: str, name: str) -> list[Path]:
    return [root() / parent / name]


def list_names(parent: str) -> list[str]:
    d = root() / parent
    if not d.is_dir():
        return []
    return sorted(p.name for p in d.iterdir() if p.is_dir())


def remove_parent(parent: str) -> None:
    with contextlib.suppress(FileNotFoundError, OSError):
        (root() / parent).rmdir()
