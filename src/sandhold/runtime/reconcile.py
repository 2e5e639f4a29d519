"""Reconcile: make what is on disk and in the kernel match the sandboxes that really exist,
whatever a crash interrupted. ``Runtime.open()`` runs it, and the sandbox service every
``reconcile_interval_s``; runs are serialized across processes by ``data_dir/reconcile.lock``.

How a directory tells who is making or unmaking it:

- ``assembly.claim``: a create first makes ``sandboxes/.new-<id>-<pid>-<start>`` (the name says
  which process, by pid and start time, so a reused pid is not mistaken for it), creates ``lock``
  in it and flocks it, and only then renames it to ``sandboxes/<id>``. The lock stays held until the
  create has returned or undone itself. So under its final name a sandbox directory always has
  a lock file, held by whoever is still creating it, in this process or any other: a flock
  conflicts between any two opens of the file, and dies with its holder.
- ``assembly.remove_dir``: every destroy removes cgroups, processes and mounts first and the lock
  file last, so a directory without one has nothing left but files.

What reconcile does with each entry of ``sandboxes/``:

- ``state.json``: a sandbox; re-attached (``liveness.get`` judges one whose processes are gone;
  a running one frozen by a pause that was not recorded is marked paused).
- lock held: a create, kill or other operation in flight: left alone.
- ``killing.json``, lock free: a kill that was interrupted: finished.
- neither, lock free or no lock file: a create (or its undoing) interrupted: removed.
- ``.new-...`` of a process that is gone: removed (it holds nothing but the lock file).

Removing means every kind of debris a create makes: the processes in the sandbox's cgroups and
those not in them yet (the shell that joins them, a bwrap adopted by init: named by their command
line), the cgroups in every hierarchy, the mounts under the directory (the overlay, the disk),
the egress record, the directory, and then the sandbox's uid range. Last, cgroups of this
runtime's parent with no directory are killed and removed, and uid ranges whose sandbox has no
directory are given back.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path

from sandhold.errors import SandboxNotFound, SandholdError
from sandhold.runtime import cgroup_parent, cgroups, liveness, mounts, safefs
from sandhold.runtime.assembly import STAGING, destroy
from sandhold.runtime.host import Host
from sandhold.runtime.reaping import parent_of
from sandhold.runtime.spec import NAME_RE
from sandhold.runtime.staging import start_time

log = logging.getLogger(__name__)

KILL_TIMEOUT_S = 10.0


@dataclass
class Report:
    """What one run found and did."""

    sandboxes: int = 0  # re-attached
    reaped: int = 0  # records gone meanwhile (killed, or judged by liveness.get)
    kills_finished: int = 0
    creates_removed: int = 0
    staging_removed: int = 0
    orphan_cgroups: int = 0
    uid_ranges: int = 0  # given back: their sandbox's directory is gone
    in_flight: int = 0  # left alone: someone holds the lock
    failed: int = 0  # could not be cleaned this time; the next run tries again

    @property
    def cleaned(self) -> int:
        return (
            self.kills_finished
            + self.creates_removed
            + self.staging_removed
            + self.orphan_cgroups
            + self.uid_ranges
        )

    def __str__(self) -> str:
        return ", ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))


@contextlib.contextmanager
def _try_lock(d: Path) -> Iterator[bool | None]:
    """True: we hold the directory's lock; False: someone else does; None: it has none."""
    try:
        fd = os.open(d / "lock", os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        yield None
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


# -- debris ---------------------------------------------------------------------------------------


def cgroup_names(parent: str) -> set[str]:
    """Groups under ``parent`` in any hierarchy (a create can die between two mkdirs)."""
    names: set[str] = set()
    for d in cgroups.group_dirs(parent, ""):
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            names |= {p.name for p in d.iterdir() if p.is_dir()}
    return names


def cgroup_pids(dirs: list[Path]) -> set[int]:
    """The pids in the groups that this process can see. A PID namespace (a pod's) lists the
    tasks it cannot see as 0, and signalling pid 0 would kill our own process group."""
    pids: set[int] = set()
    for d in dirs:
        with contextlib.suppress(FileNotFoundError):
            pids |= {p for p in map(int, (d / "cgroup.procs").read_text().split()) if p > 0}
    return pids


def _strays(prefixes: tuple[str, ...]) -> set[int]:
    """Session leaders (a sandbox's tree is started in a session of its own) whose command line
    names one of ``prefixes``: the shell that moves itself into the sandbox's cgroups before
    it execs bwrap, or a bwrap, when they are not (yet, or any more) in those cgroups."""
    found = set()
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text().rpartition(")")[2].split()
            if stat[0] == "Z" or stat[3] != p.name:
                continue
            argv = (p / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        if any(a.decode(errors="replace").startswith(prefixes) for a in argv):
            found.add(int(p.name))
    return found


def _reap_adopted(pids: set[int]) -> None:
    """Killed processes that were re-parented to us (the runtime is a subreaper) are ours to
    reap; those adopted by init are reaped by init."""
    deadline = time.monotonic() + 1.0
    for pid in pids:
        while parent_of(pid) == os.getpid() and time.monotonic() < deadline:
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    break
            except ChildProcessError:
                break
            time.sleep(0.001)


def _kill_once(host: Host, name: str, dirs: list[Path], prefixes: tuple[str, ...]) -> set[int]:
    """SIGKILL every process of the sandbox, in its cgroups or not, until none is left."""
    killed: set[int] = set()
    deadline = time.monotonic() + KILL_TIMEOUT_S
    while pids := cgroup_pids(dirs) | _strays(prefixes):
        if time.monotonic() > deadline:
            raise TimeoutError(f"processes of sandbox {name} survived SIGKILL: {sorted(pids)}")
        cg = host.cgroup(name)
        with contextlib.suppress(OSError, TimeoutError):  # a group made only in part
            cg.kill_all()  # cgroup.kill, or freeze-kill-thaw: nothing forks away meanwhile
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError, TimeoutError):
            if cg.frozen():
                cg.thaw()  # SIGKILL is only delivered to thawed tasks (v1)
        killed |= pids
        time.sleep(0.002)
    return killed


def _rmdirs(dirs: list[Path]) -> bool:
    """Remove the groups; False if a process joined one meanwhile."""
    for g in dirs:
        for _ in range(200):
            try:
                g.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                if cgroup_pids([g]):
                    return False
                time.sleep(0.005)  # a dying task can keep the group busy for a moment
    return True


def _kill(host: Host, name: str, d: Path | None) -> None:
    """Kill every process of sandbox ``name`` and remove its cgroups from every hierarchy. A
    shell that was started before a crash joins the groups when it gets the CPU: kill again
    until the groups are gone."""
    dirs = cgroups.group_dirs(host.cgroup_group, name)
    prefixes = tuple(f"{p}/" for p in ([d] if d else []) + dirs)
    killed: set[int] = set()
    try:
        for _ in range(10):
            killed |= _kill_once(host, name, dirs, prefixes)
            if _rmdirs(dirs):
                return
        raise TimeoutError(f"cgroups of sandbox {name} kept gaining processes")
    finally:
        _reap_adopted(killed)


def _remove(host: Host, name: str) -> None:
    """Remove everything of sandbox ``name`` (whose lock we hold, or which has none)."""
    d = host.sandboxes_dir / name
    _kill(host, name, d)
    for target in reversed(mounts.mounts_under(d)):  # the overlay, then what is under it
        mounts.umount(Path(target))
    destroy(host, name)  # what else a sandbox holds (the egress record), then the directory


# -- the run --------------------------------------------------------------------------------------


def _mark_paused(host: Host, sandbox_id: str) -> None:
    """A crash between freezing and recording left a frozen sandbox marked running."""
    try:
        with host.records.locked(sandbox_id) as d:
            info = host.records.load(d)
            if info.state == "running" and host.cgroup(sandbox_id).frozen():
                info.state = "paused"
                host.records.save(info)
    except SandboxNotFound:
        pass


def _attach(host: Host, d: Path, report: Report) -> None:
    try:
        info = liveness.get(host, d.name)  # reaps a sandbox whose processes are gone
    except SandboxNotFound:
        report.reaped += 1
        return
    except (ValueError, KeyError) as e:
        with _try_lock(d) as held:
            if held is False:
                report.in_flight += 1
                return
            log.error("unreadable sandbox state %s (%s); removing it", d, e)
            _remove(host, d.name)
            report.creates_removed += 1
            return
    report.sandboxes += 1
    with contextlib.suppress(FileNotFoundError):
        if info.state == "running" and host.cgroup(info.id).frozen():
            _mark_paused(host, info.id)


def _sweep(host: Host, d: Path, report: Report) -> None:
    if d.name.startswith(STAGING):
        parts = d.name[len(STAGING) :].split("-")  # <id>-<pid>-<start>
        pid, start = (parts[1], parts[2]) if len(parts) == 3 else ("", "")
        if pid.isdigit() and start_time(int(pid)) == start:
            report.in_flight += 1  # its creator is alive and will rename or remove it
            return
        safefs.remove_quietly(d)
        report.staging_removed += 1
        return
    if not NAME_RE.match(d.name) or not d.is_dir():
        return
    if (d / "state.json").exists():
        _attach(host, d, report)
        return
    with _try_lock(d) as held:
        if held is False:
            report.in_flight += 1
            return
        # Decided under the lock: a create that finished a moment ago has its state.json now.
        if (d / "state.json").exists():
            pass
        elif (d / "killing.json").exists():
            log.warning("finishing the interrupted kill of sandbox %s", d.name)
            _remove(host, d.name)
            report.kills_finished += 1
            return
        else:
            log.warning("removing sandbox %s, whose create was interrupted", d.name)
            _remove(host, d.name)
            report.creates_removed += 1
            return
    _attach(host, d, report)  # outside the lock: reaping takes it


def reconcile(host: Host) -> Report:
    """Re-attach to live sandboxes and clean up what a crash or a failed create left behind."""
    report = Report()
    lock = os.open(host.settings.data_dir / "reconcile.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        group = host.cgroup_group
        # Listed before the directories: a create claims its directory before it makes groups,
        # so a group seen here whose directory is gone below belongs to no create in flight.
        groups = cgroup_names(group)
        for d in sorted(host.sandboxes_dir.iterdir()):
            try:
                _sweep(host, d, report)
            except Exception:
                log.exception("reconcile: could not clean up %s", d)
                report.failed += 1
        if any((d / "egress.json").exists() for d in host.sandboxes_dir.iterdir()):
            try:
                host.egress.sync()  # re-attach: the daemon serves every egress sandbox again
            except SandholdError as e:
                log.error("egress daemon unavailable: %s", e)
        known = {d.name for d in host.sandboxes_dir.iterdir()}
        for name in sorted(groups - known):
            if not any(g.exists() for g in cgroups.group_dirs(group, name)):
                continue  # a sandbox removed above
            try:
                _kill(host, name, None)
                report.orphan_cgroups += 1
            except Exception:
                log.exception("reconcile: could not remove cgroup %s", name)
                report.failed += 1
        # A range is taken after its sandbox's directory exists and given back after it is
        # gone: one whose directory is missing has nothing left (a crash between the two).
        for base, owner in host.uids.held().items():
            if not NAME_RE.match(owner) or not (host.sandboxes_dir / owner).exists():
                host.uids.release(base, owner)
                report.uid_ranges += 1
        report.uid_ranges += host.uids.release_orphans()
        cgroup_parent.prune(host.settings.uid_registry)
    finally:
        os.close(lock)
    if report.cleaned or report.failed:
        log.warning("reconcile: %s", report)
    return report
