"""Suspend to disk: a paused sandbox's processes checkpointed (process_tree.py) and gone,
its memory freed, its files and memory image kept; resume restores them as they were.

A suspended sandbox is recorded ``paused`` with ``suspended = "disk"``; its cgroups stay (empty,
the restore goes back into them), as do its uid range and its image in ``checkpoint/``
(lz4-compressed: suspend_compress); its own mounts are let go (release_mounts). Nothing of it
runs, so it survives a server restart as it is, and a host reboot: resume first mounts again
what is not mounted (boot.remount: the layer's image, the root's overlay, the handoff tmpfs,
the views of its binds) and makes its cgroups. A dump that fails leaves it paused in the
freezer as before, with the error; a restore that fails kills whatever it had started and
leaves it suspended, image and all, with the error.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from sandhold.errors import CheckpointFailed, Conflict, HostUnsupported
from sandhold.runtime import disk, mounts, safefs
from sandhold.runtime.boot import boot, remount, save_handoff
from sandhold.runtime.checkpoint import process_tree
from sandhold.runtime.checkpoint.criu import FIX, criu_status
from sandhold.runtime.host import Host
from sandhold.runtime.launcher import listen
from sandhold.runtime.reaping import pid_namespace, reap_init
from sandhold.runtime.records import SandboxInfo

log = logging.getLogger(__name__)

DISK = "disk"
FILESYSTEM = "filesystem"  # no memory kept: resume boots afresh over the files


def criu_path(host: Host) -> process_tree.Criu:
    ok, detail = criu_status(host.settings.criu_path)
    if not ok:
        raise HostUnsupported(f"suspending to disk needs CRIU >= 4.1: {detail}; {FIX}")
    return process_tree.Criu(host.settings.criu_path, host.settings.criu_timeout_s)


def suspend(host: Host, sandbox_id: str) -> SandboxInfo:
    """Checkpoint a running or paused sandbox to disk; it is then paused, with no process."""
    criu = criu_path(host)
    with host.records.locked(sandbox_id) as d:
        info = host.records.load(d)
        if info.state == "failed":
            raise Conflict(f"sandbox {sandbox_id} failed ({info.failure}); it can only be killed")
        if info.suspended:
            raise Conflict(f"sandbox {sandbox_id} is already suspended to disk")
        cg = host.cgroup(sandbox_id)
        frozen = info.state == "paused"
        if frozen:
            cg.thaw()  # the agent must run to let go of the host's descriptors
        try:
            process_tree.quiesce(info.agent_socket, info.init_pid)
            try:
                process_tree.dump(criu, d, info.init_pid)
            except CheckpointFailed:
                safefs.remove_quietly(d / process_tree.IMAGES)
                hand_back(d, info.init_pid)  # it carries on where it was
                raise
        except BaseException:
            if frozen:
                cg.freeze()  # paused in the freezer, as it was
            raise
        # Never frozen again once dumped: its dying tasks may still be listed, and a frozen
        # group would freeze the restore that joins it.
        bwrap = host.children.pop(sandbox_id)
        if bwrap is not None:
            bwrap.wait()  # exits with the tree
        deadline = time.monotonic() + 5
        while cg.pids() and time.monotonic() < deadline:
            time.sleep(0.005)
        info.state, info.suspended = "paused", DISK
        info.paused_at = info.paused_at or time.time()
        host.records.save(info)
        try:
            if host.settings.suspend_compress:
                process_tree.compress_pages(d / process_tree.IMAGES)
        except OSError as e:  # (a full disk) what is not compressed stays as it was dumped
            log.warning("the memory image of %s is kept uncompressed: %s", sandbox_id, e)
        release_mounts(d)
        return info


def release_mounts(d: Path) -> None:
    """A sandbox suspended to disk keeps no mount or loop device of its own on the host (its
    root's overlay, its layer's filesystem, its handoff tmpfs): the host's mount table, which
    every create copies, holds live sandboxes only. Resume mounts them again (boot.remount), the
    sandbox's boot id kept (boot.save_handoff). The views of what it binds from the host (a
    workspace, writable mounts) stay: another sandbox could take a workspace in between."""
    try:
        save_handoff(d)
        mounts.umount(d / "root")
        mounts.umount(d / process_tree.HANDOFF)
        # Not waited for: a copy of the host's mounts held a moment longer elsewhere (a bwrap
        # or a criu starting) keeps the layer's loop device attached until it goes; remount
        # waits then.
        mounts.umount(d / disk.MOUNT)
    except OSError as e:  # what is still mounted stays so; resume mounts the rest
        log.warning("%s keeps some of its mounts while paused: %s", d.name, e)


def drop_processes(host: Host, sandbox_id: str) -> SandboxInfo:
    """A filesystem-only pause: the sandbox's processes (and memory, and any checkpoint of
    it) are dropped, its files, uid range and cgroups kept; resume boots it afresh."""
    with host.records.locked(sandbox_id) as d:
        info = host.records.load(d)
        if info.state == "failed":
            raise Conflict(f"sandbox {sandbox_id} failed ({info.failure}); it can only be killed")
        if info.suspended == FILESYSTEM:
            raise Conflict(f"sandbox {sandbox_id} is already paused without its memory")
        cg = host.cgroup(sandbox_id)
        if not info.suspended:
            cg.thaw()  # a frozen task dies only once it runs
            cg.kill_all()
            bwrap = host.children.pop(sandbox_id)
            if bwrap is not None:
                bwrap.wait()
            reap_init(info.init_pid)
        safefs.remove_quietly(d / process_tree.IMAGES)
        host.uids.give_back(d)  # the boot binds them again
        host.wsdisk.release(d)
        (d / "run" / "agent.sock").unlink(missing_ok=True)
        info.state, info.suspended = "paused", FILESYSTEM
        info.paused_at = info.paused_at or time.time()
        host.records.save(info)
        release_mounts(d)
        return info


def cold_boot(host: Host, d: Path, info: SandboxInfo) -> None:
    """Boot a sandbox paused without its memory over its files (under its lock)."""
    assert info.host_uid is not None
    cg = host.cgroup(info.id)
    if not cg.exists():  # the host rebooted
        limits = info.spec.limits
        cg.create(limits.memory_mb, limits.cpu, limits.pids)
    elif cg.frozen():
        cg.thaw()
    remount(host, d, info, binds=False)  # the boot binds them
    proc, init_pid, _workspace, _spec = boot(
        host, d, info.spec, host.templates.get(info.template), info.host_uid
    )
    host.children.add(info.id, proc)
    info.pid, info.init_pid, info.suspended = proc.pid, init_pid, None
    info.pid_ns = pid_namespace()


def restore(host: Host, d: Path, info: SandboxInfo) -> None:
    """Bring a suspended sandbox back (called under its lock); updates ``info``."""
    criu = criu_path(host)
    cg = host.cgroup(info.id)
    if not cg.exists():  # the host rebooted
        limits = info.spec.limits
        cg.create(limits.memory_mb, limits.cpu, limits.pids)
    if cg.frozen():
        cg.thaw()  # whatever froze it: what joins a frozen group stops there
    remount(host, d, info, binds=True)
    procs = cg.procs_files()
    assert info.host_uid is not None
    try:
        pid = process_tree.restore(criu, d, procs, info.host_uid)
        hand_back(d, pid)
    except BaseException:
        cg.kill_all()  # nothing half-restored stays; the image does
        raise
    info.pid = info.init_pid = pid
    info.pid_ns = pid_namespace()
    info.suspended = None
    safefs.remove_quietly(d / process_tree.IMAGES)


def hand_back(d: Path, agent_pid: int, rebind: bool = False) -> None:
    """A new listening socket and log file for the agent, which has let go of its own; with
    ``rebind``, its configuration too (``run/agent.json``: a warm start's, its own)."""
    sock_path = d / "run" / "agent.sock"
    sock_path.unlink(missing_ok=True)
    listener = listen(sock_path)
    log_fd = os.open(
        d / "sandbox.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600
    )
    config_fd = os.open(d / "run" / "agent.json", os.O_RDONLY | os.O_CLOEXEC) if rebind else None
    try:
        process_tree.handoff(d, agent_pid, listener, log_fd, config_fd)
    finally:
        listener.close()
        os.close(log_fd)
        if config_fd is not None:
            os.close(config_fd)
