"""The cgroup v1 backend, for hybrid hosts (like the machines this project is built on).

Limits live in cgroup v1 (memory, cpu, cpuacct, pids, freezer) because on these hosts the v2
hierarchy carries no resource controllers. A v2 group is added when the unified hierarchy is
mounted, only for ``cgroup.kill``: it kills a whole tree atomically, even one that forks while
being killed.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from sandhold.errors import HostUnsupported
from sandhold.runtime.cgroup_files import (
    CGROUP_ROOT,
    CPU_PERIOD_US,
    Group,
    read,
    read_proc,
    remove_group,
    write,
)

V1_CONTROLLERS = ("memory", "cpu", "cpuacct", "pids", "freezer")
V2_ROOT = CGROUP_ROOT / "unified"


def _roots() -> list[Path]:
    """Every hierarchy a sandbox's group is made in: the v1 controllers', then v2's."""
    return [CGROUP_ROOT / c for c in V1_CONTROLLERS] + [V2_ROOT]


def missing_controllers() -> list[str]:
    return [c for c in V1_CONTROLLERS if not (CGROUP_ROOT / c / "cgroup.procs").exists()]


def has_v2_kill() -> bool:
    return (V2_ROOT / "cgroup.procs").exists()


@dataclass(frozen=True)
class V1Group(Group):
    """The cgroups of one sandbox, addressed by its id (the same name in every hierarchy)."""

    name: str
    parent: str  # one parent group per runtime data dir, so runtimes never touch each other

    def v1(self, controller: str) -> Path:
        return CGROUP_ROOT / controller / self.parent / self.name

    @property
    def v2(self) -> Path:
        return V2_ROOT / self.parent / self.name

    def dirs(self) -> list[Path]:
        dirs = [self.v1(c) for c in V1_CONTROLLERS]
        if has_v2_kill():
            dirs.append(self.v2)
        return dirs

    def create(self, memory_mb: int, cpu: float, pids: int) -> None:
        missing = missing_controllers()
        if missing:
            raise HostUnsupported(
                f"cgroup v1 controllers not mounted: {', '.join(missing)} (run `sandhold doctor`)"
            )
        for d in self.dirs():
            d.mkdir(parents=True, exist_ok=True)
        mem = self.v1("memory")
        limit = memory_mb * 1024 * 1024
        # RAM+swap capped at the RAM limit: a sandbox never swaps the host to death. The
        # kernel keeps memsw >= RAM at every step, so a limit raised (a pooled sandbox's,
        # pool.py) writes memsw first, one lowered writes it last.
        files = ["memory.limit_in_bytes"]
        if (mem / "memory.memsw.limit_in_bytes").exists():
            raising = limit > int(read(mem / "memory.limit_in_bytes") or 0)
            files.insert(0 if raising else 1, "memory.memsw.limit_in_bytes")
        for name in files:
            write(mem / name, str(limit))
        write(self.v1("cpu") / "cpu.cfs_period_us", str(CPU_PERIOD_US))
        write(self.v1("cpu") / "cpu.cfs_quota_us", str(int(cpu * CPU_PERIOD_US)))
        write(self.v1("pids") / "pids.max", str(pids))

    def add(self, pid: int) -> None:
        """Move a process (0: the caller) into every group of the sandbox."""
        for d in self.dirs():
            write(d / "cgroup.procs", str(pid))

    def procs_files(self) -> list[str]:
        """Its ``cgroup.procs`` in every hierarchy: what a process joining it writes itself to."""
        return [str(d / "cgroup.procs") for d in self.dirs()]

    def pids(self) -> list[int]:
        # (a str path: a listing asks every sandbox's cgroup, and pathlib's joins cost more
        # than the read)
        try:
            text = read_proc(f"{CGROUP_ROOT}/pids/{self.parent}/{self.name}/cgroup.procs")
        except FileNotFoundError:
            return []
        return [int(p) for p in text.split()]

    def populated(self) -> bool:
        try:  # counted whatever the namespace: cgroup.procs omits another namespace's tasks
            return int(read_proc(f"{self.v1('pids')}/pids.current")) > 0
        except FileNotFoundError:
            return False

    def exists(self) -> bool:
        return self.v1("pids").is_dir()

    # -- freezer ----------------------------------------------------------------------------
    def freezer_state(self) -> str:
        return read(self.v1("freezer") / "freezer.state").strip()

    def frozen(self) -> bool:
        return self.freezer_state() == "FROZEN"

    def freezer_dir(self) -> Path:
        return self.v1("freezer")

    def _set_freezer(self, want: str, timeout: float = 5.0) -> None:
        path = self.v1("freezer") / "freezer.state"
        deadline = time.monotonic() + timeout
        write(path, want)
        while read(path).strip() != want:
            if time.monotonic() > deadline:
                raise TimeoutError(f"freezer did not reach {want}")
            write(path, want)
            time.sleep(0.0005)

    def freeze(self) -> None:
        self._set_freezer("FROZEN")

    def thaw(self) -> None:
        self._set_freezer("THAWED")

    # -- teardown ---------------------------------------------------------------------------
    def kill_all(self, timeout: float = 10.0) -> None:
        """Kill every process of the sandbox, frozen or not, and wait until none is left."""
        if not self.exists():
            return
        deadline = time.monotonic() + timeout
        if self.v2.is_dir() and (self.v2 / "cgroup.kill").exists():
            write(self.v2 / "cgroup.kill", "1")
        else:
            # v1 fallback: freeze so nothing forks while we signal, kill, then thaw to let them die.
            self.freeze()
            for pid in self.pids():
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
        if self.v1("freezer").is_dir() and self.freezer_state() != "THAWED":
            self.thaw()  # SIGKILL is only delivered to thawed tasks
        while pids := self.pids():
            if time.monotonic() > deadline:
                raise TimeoutError(f"processes of sandbox {self.name} survived SIGKILL")
            # A process still joining the groups (a create cut short: its shell writes itself
            # into one group after another) may be in the v1 groups and not yet in the v2 one
            # that cgroup.kill empties: signal every one listed, again until none is left.
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
            time.sleep(0.001)

    def remove(self) -> None:
        for d in self.dirs():
            remove_group(d)

    # -- usage ------------------------------------------------------------------------------
    def usage(self) -> dict[str, int]:
        mem = self.v1("memory")
        stat = dict(line.split() for line in read(mem / "memory.stat").splitlines())
        oom = dict(line.split() for line in read(mem / "memory.oom_control").splitlines())
        return {
            "cpu_ns": int(read(self.v1("cpuacct") / "cpuacct.usage")),
            "memory_bytes": int(read(mem / "memory.usage_in_bytes")),
            "memory_cache_bytes": int(stat.get("total_cache", stat.get("cache", "0"))),
            "memory_rss_bytes": int(stat.get("total_rss", stat.get("rss", "0"))),
            "memory_limit_bytes": int(read(mem / "memory.limit_in_bytes")),
            "oom_kills": int(oom.get("oom_kill", "0")),
            "pids": int(read(self.v1("pids") / "pids.current")),
        }

    def oom_kills(self) -> int:
        """OOM kills inside the sandbox (KeyError or OSError: the group is gone)."""
        text = read_proc(f"{self.v1('memory')}/memory.oom_control")
        at = text.find(b"oom_kill ")
        return int(text[at + 9 :].split(None, 1)[0]) if at >= 0 else 0


def group_dirs(parent: str, name: str) -> list[Path]:
    """The group ``name`` in every hierarchy it may have been made in, v1 and v2."""
    return [r / parent / name for r in _roots()]


def list_names(parent: str) -> list[str]:
    d = CGROUP_ROOT / "pids" / parent
    if not d.is_dir():
        return []
    return sorted(p.name for p in d.iterdir() if p.is_dir())


def remove_parent(parent: str) -> None:
    """Remove a runtime's (empty) parent groups, e.g. when a test data dir is thrown away."""
    for root in _roots():
        with contextlib.suppress(OSError):  # absent, or not empty
            (root / parent).rmdir()
