"""Assembling a sandbox's directory on this host and taking it apart: the claim of a new
directory (its lock held until the create is over), the writable root, and the destroy that
removes every trace, the lock file last. How reconcile tells debris by this contract:
reconcile.py."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from pathlib import Path

from sandhold.errors import Conflict, InvalidRequest, SandholdError
from sandhold.runtime import mounts, safefs
from sandhold.runtime.host import Host
from sandhold.runtime.launcher import HANDOFF
from sandhold.runtime.reaping import reap_init
from sandhold.runtime.records import ID_ALPHABET, new_sandbox_id
from sandhold.runtime.spec import NAME_RE, SandboxSpec
from sandhold.runtime.staging import start_time
from sandhold.runtime.templates.store import SANDBOX_USER_UID, Template

log = logging.getLogger(__name__)

STAGING = ".new-"  # a directory being claimed: ``.new-<id>-<pid>-<start>``
UID_FILE = "uid"  # the first host id of the sandbox's range


def free_id(host: Host, given: str | None) -> str:
    """``given`` (an id the caller chose: a fleet's edge) if no sandbox here has it, else a new
    id."""
    if given is None:
        return new_sandbox_id()
    if not 8 <= len(given) <= 64 or not set(given) <= set(ID_ALPHABET):
        raise InvalidRequest(f"invalid sandbox id {given!r}: 8 to 64 of [a-z0-9]")
    if (host.sandboxes_dir / given).exists():
        raise Conflict(f"sandbox {given} already exists")
    return given


def claim(d: Path) -> int:
    """Make the sandbox directory ``d`` with its lock file held; returns the lock's fd, which
    the caller keeps open until its create is over (then the directory is either a sandbox
    with ``state.json``, or gone)."""
    if d.exists():
        raise FileExistsError(d)
    pid = os.getpid()
    staging = d.with_name(f"{STAGING}{d.name}-{pid}-{start_time(pid)}")
    staging.mkdir()
    try:
        fd = os.open(staging / "lock", os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.rename(staging, d)  # appears under its name with the lock already held
        except BaseException:
            os.close(fd)
            raise
    except BaseException:
        safefs.remove_quietly(staging)
        raise
    return fd


def remove_dir(d: Path) -> None:
    """Remove a sandbox's directory, its lock file last (see the module's docstring)."""
    try:
        entries = list(os.scandir(d))
    except FileNotFoundError:
        return
    for e in entries:
        if e.name == "lock":
            continue
        if e.is_dir(follow_symlinks=False):
            safefs.remove_quietly(e.path)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(e.path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(d / "lock")
    with contextlib.suppress(FileNotFoundError, OSError):
        os.rmdir(d)  # not empty: a lock-less directory, which the next reconcile removes


def prepare_root(
    host: Host, d: Path, spec: SandboxSpec, template: Template, layer_image: Path | None = None
) -> int:
    """A new sandbox's uid range, cgroups, writable layer (``layer_image``'s copy, or an
    empty one), copy-on-write root and host directories; returns its first host id."""
    host_uid = host.uids.allocate(d.name)
    (d / UID_FILE).write_text(str(host_uid))  # what destroy gives back
    host.cgroup(d.name).create(spec.limits.memory_mb, spec.limits.cpu, spec.limits.pids)
    layer = host.disk.prepare(d, spec, layer_image)  # its own filesystem, of the budget
    if layer_image is not None:
        host.uids.shift_tree(layer.upper.parent, host_uid)  # another range wrote it
    with host.uids.lower(template.lowers(), host_uid, d) as lower:
        mounts.mount_overlay(lower, layer.upper, layer.work, d / "root")
    run_dir = d / "run"
    run_dir.mkdir(mode=0o700)
    os.chown(run_dir, host_uid, host_uid)
    # A tmpfs of its own: bound in, its root shows as "/", not as a path of the data dir.
    mounts.mount_tmpfs(d / HANDOFF, 64 << 10, 0o755)
    return host_uid


def workspace_path(host: Host, workspace_id: str) -> Path:
    if not NAME_RE.match(workspace_id):
        raise InvalidRequest(f"workspace id {workspace_id!r} is not valid")
    return host.workspaces_dir / workspace_id


def prepare_workspace(host: Host, workspace_id: str | None, directory: Path | None) -> Path:
    """The workspace directory (``directory``, or the named one's), made if new and owned by
    the sandbox user."""
    workspace = directory or workspace_path(host, str(workspace_id))
    workspace.mkdir(mode=0o755, exist_ok=True)
    owner = host.settings.uid_base + SANDBOX_USER_UID
    if workspace.stat().st_uid != owner:
        os.chown(workspace, owner, owner)
    return workspace


def destroy(host: Host, sandbox_id: str, init_pid: int | None = None) -> None:
    """Remove every trace of a sandbox; safe to call on a half-created one."""
    d = host.sandboxes_dir / sandbox_id
    host.records.forget(sandbox_id)
    cg = host.cgroup(sandbox_id)
    cg.kill_all()
    proc = host.children.pop(sandbox_id)
    if proc is not None:
        proc.wait()  # bwrap, our child if this process created the sandbox
    reap_init(init_pid)
    cg.remove()
    host.uids.give_back(d)
    host.wsdisk.release(d)  # after the views of it, before the range is given back
    mounts.umount(d / "root")
    mounts.umount(d / HANDOFF)
    host.disk.release(d)
    had_egress = (d / "egress.json").exists()
    if had_egress:
        host.egress.forget(d)
    host_uid = None
    with contextlib.suppress(FileNotFoundError, ValueError):
        host_uid = int((d / UID_FILE).read_text())
    remove_dir(d)  # the lock file last: reconcile tells debris by it
    if host_uid is not None:  # nothing it owned is left: its processes, layer, views
        host.uids.release(host_uid, sandbox_id)
    if had_egress:
        try:
            host.egress.sync(start=False)  # close its socket; the daemon exits after the last
        except SandholdError as e:
            log.warning("egress daemon sync after removing %s failed: %s", sandbox_id, e)
