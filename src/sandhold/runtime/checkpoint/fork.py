"""Fork: one checkpoint of a running sandbox, taken in place, and ``count`` new sandboxes
restored from it, each with its own copy of the writable layer, its own id, uid range, cgroups,
network namespace and limits; the source carries on (its id and record untouched).

The checkpoint is consistent: the source's agent quiesces (process_tree.py), its cgroup is frozen,
its layer's filesystem is synced and its image copied, and CRIU dumps the frozen tree leaving
it in place; then the source is thawed and handed its socket back. Each fork gets a copy of the
layer image with its owners moved to the fork's uid range, the images with its user namespace
remapped onto that range (criuimg.py), and is restored like a suspended sandbox.

Not forked (refused, nothing made): a sandbox bound to host directories (a workspace, operator
mounts: they would be shared, not copied), with egress (its proxy binds are its own), without a
disk budget (no layer image to copy), or not running.
"""

from __future__ import annotations

import ctypes
import json
import os
import tempfile
import time
from pathlib import Path

from sandhold.errors import Conflict, InvalidRequest, SandholdError, Unsupported
from sandhold.runtime import disk, images, safefs
from sandhold.runtime.assembly import claim, destroy, prepare_root
from sandhold.runtime.checkpoint import process_tree
from sandhold.runtime.checkpoint.suspend import criu_path, hand_back
from sandhold.runtime.host import Host
from sandhold.runtime.launcher import new_boot
from sandhold.runtime.reaping import pid_namespace
from sandhold.runtime.records import SandboxInfo, new_sandbox_id
from sandhold.runtime.spec import SandboxSpec

MAX_FORKS = 20  # E2B's bound on count
FORKING = "forking"  # under data_dir: one checkpoint per fork in flight
_libc = ctypes.CDLL(None, use_errno=True)


def check_forkable(info: SandboxInfo, what: str = "forked") -> None:
    why = None
    if info.state != "running" or info.suspended:
        raise Conflict(f"sandbox {info.id} is {info.state}: only a running sandbox can be {what}")
    if info.workspace is not None or info.spec.mounts:
        why = "it has host directories bound in (a workspace or mounts), which forks would share"
    elif info.spec.network.mode != "none":
        why = f"it has egress (network mode {info.spec.network.mode!r}); forks need 'none'"
    elif info.spec.limits.disk_mb is None:
        why = "it has no disk budget (disk_enforced=false): there is no layer image to copy"
    if why:
        raise Unsupported(f"sandbox {info.id} cannot be {what}: {why}")


def checkpoint_in_place(host: Host, info: SandboxInfo, into: Path, memory: bool = True) -> None:
    """The running sandbox's layer image (``into/disk.img``) and, with ``memory``, its memory
    (``into/checkpoint``), at one instant; it runs on afterwards. Called under its lock."""
    criu = criu_path(host) if memory else None
    d, cg = info.dir, host.cgroup(info.id)
    if info.suspended:  # (filesystem only) nothing runs nor is mounted: its image is at rest
        images.copy_sparse(d / disk.IMAGE, into / disk.IMAGE)
        return
    if criu is not None:
        process_tree.quiesce(info.agent_socket, info.init_pid)
    try:
        cg.freeze()
        try:
            fd = os.open(d / disk.MOUNT, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                if _libc.syncfs(fd) != 0:
                    raise OSError(ctypes.get_errno(), "syncfs of the sandbox's layer")
            finally:
                os.close(fd)
            images.copy_sparse(d / disk.IMAGE, into / disk.IMAGE)
            if criu is not None:
                process_tree.dump(
                    criu, d, info.init_pid, into / process_tree.IMAGES, freezer=cg.freezer_dir()
                )
        finally:
            if info.state == "running":
                cg.thaw()
    finally:
        if criu is not None:
            hand_back(d, info.init_pid)


def start(
    host: Host,
    spec: SandboxSpec,
    template_name: str,
    taken: Path,
    extra: dict[str, object],
    started_from: str = "fork",
    config: dict[str, object] | None = None,
    sandbox_id: str | None = None,
) -> SandboxInfo:
    """A new sandbox restored from what ``checkpoint_in_place`` took into ``taken``; with
    ``config``, its agent is handed that configuration (a warm start's: warm.py); with
    ``sandbox_id``, under that id."""
    criu = criu_path(host)
    template = host.templates.get(template_name)
    sandbox_id = sandbox_id or new_sandbox_id()
    d = host.sandboxes_dir / sandbox_id
    lock = claim(d)
    try:
        host_uid = prepare_root(host, d, spec, template, layer_image=taken / disk.IMAGE)
        process_tree.copy_images(taken / process_tree.IMAGES, d / process_tree.IMAGES)
        new_boot(d / process_tree.HANDOFF, sandbox_id, template_name)  # a new sandbox: its boot
        if config is not None:
            (d / "run" / "agent.json").write_text(json.dumps(config))
        procs = host.cgroup(sandbox_id).procs_files()
        pid = process_tree.restore(criu, d, procs, host_uid, own=False)
        hand_back(d, pid, rebind=config is not None)
        info = SandboxInfo(
            id=sandbox_id,
            template=template_name,
            state="running",
            spec=spec,
            created_at=time.time(),
            pid=pid,
            init_pid=pid,
            dir=d,
            workspace=None,
            extra=dict(extra),
            host_uid=host_uid,
            started_from=started_from,
            pid_ns=pid_namespace(),
        )
        host.records.save(info)
        safefs.remove_quietly(d / process_tree.IMAGES)
        return info
    except BaseException:
        destroy(host, sandbox_id, None)
        raise
    finally:
        os.close(lock)


def fork(
    host: Host, sandbox_id: str, extras: list[dict[str, object]]
) -> list[SandboxInfo | SandholdError]:
    """One fork per entry of ``extras`` (each fork's record extras); each succeeds or fails on
    its own, as E2B's fork does."""
    if not 1 <= len(extras) <= MAX_FORKS:
        raise InvalidRequest(f"count must be between 1 and {MAX_FORKS}")
    criu_path(host)
    with host.records.locked(sandbox_id) as d:
        source = host.records.load(d)
        check_forkable(source)
        # Not under the source's directory: the source may be killed while its forks start.
        (host.settings.data_dir / FORKING).mkdir(mode=0o700, exist_ok=True)
        taken = Path(tempfile.mkdtemp(dir=host.settings.data_dir / FORKING))
        try:
            checkpoint_in_place(host, source, taken)
        except BaseException:
            safefs.remove_quietly(taken)
            raise
    try:
        out: list[SandboxInfo | SandholdError] = []
        for extra in extras:
            try:
                out.append(start(host, source.spec, source.template, taken, extra))
            except SandholdError as e:
                out.append(e)
        return out
    finally:
        safefs.remove_quietly(taken)
