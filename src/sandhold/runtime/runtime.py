"""The runtime: creates, lists, pauses, resumes and destroys sandboxes on this host.

All state lives on disk under ``data_dir/sandboxes/<id>/state.json``; sandboxes are process trees
of their own (not children that die with us), so a new ``Runtime`` over the same ``data_dir``
re-attaches to every running and paused sandbox.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from pydantic import ValidationError

from sandhold.config import Settings, get_settings
from sandhold.egress.control import EgressControl
from sandhold.errors import (
    Conflict,
    HostUnsupported,
    InvalidRequest,
    SandboxNotFound,
    SandholdError,
)
from sandhold.runtime import checkpoint, ksm, mounts, suspend
from sandhold.runtime import fork as forking
from sandhold.runtime import reconcile as reconciling
from sandhold.runtime.agentlib import AgentLib
from sandhold.runtime.boot import boot
from sandhold.runtime.cgroups import CgroupSet
from sandhold.runtime.disk import DiskBudget
from sandhold.runtime.layers import LayerStore
from sandhold.runtime.pool import Pools
from sandhold.runtime.reaping import become_subreaper, ending, reap_init
from sandhold.runtime.records import (
    SandboxInfo,
    State,
    Usage,
    atomic_write,
    dir_size,
    new_sandbox_id,
    session_of,
)
from sandhold.runtime.spec import NAME_RE, NetworkPolicy, SandboxSpec, validation_message
from sandhold.runtime.templates import SANDBOX_USER_UID, Template, TemplateStore
from sandhold.runtime.uids import UidPool
from sandhold.runtime.warm import WarmStarts, wait_ready
from sandhold.runtime.wsdisk import WorkspaceDisk

log = logging.getLogger(__name__)


def _version(st: os.stat_result) -> tuple[int, int, int, int]:  # (a record file's version)
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class Runtime:
    """Plain synchronous code: every call may block (flock, waits on processes, directory
    removal); the sandbox service is the one place that moves it off an event loop.
    Construct it, then ``open()`` it before the first call."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()
        root = self.settings.data_dir
        self.sandboxes_dir = root / "sandboxes"
        self.workspaces_dir = root / "workspaces"
        self.templates = TemplateStore(root / "templates", self.settings.uid_base)
        self._agent_lib = AgentLib(root / "agentlib")
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self.egress = EgressControl(self.settings)
        self.disk = DiskBudget(self.settings)
        self.wsdisk = WorkspaceDisk(self.settings, self.disk.cache, self.sandboxes_dir)
        self.uids = UidPool(self.settings.uid_registry, root, self.settings.uid_base,
                            self.settings.uid_ranges, self.settings.uid_isolation)  # fmt: skip
        self.warm = WarmStarts(self)
        self.pools = Pools(self)
        self._records: dict[str, tuple[tuple[int, int, int, int], SandboxInfo]] = {}
        self.layers = LayerStore(self.templates.root / ".layers", self.uids)
        self._cgroup_group = self.settings.cgroup_group  # (a hash of the settings: once)
        self._opened = False

    def open(self) -> Runtime:
        """Take charge of this host's sandboxes: become the subreaper of their processes,
        re-attach to running and paused ones, clean up what a crash left, restart egress."""
        if self._opened:
            return self
        root = self.settings.data_dir
        for d in (self.sandboxes_dir, self.workspaces_dir):
            d.mkdir(parents=True, exist_ok=True)
        for d in (root, self.sandboxes_dir, self.workspaces_dir):
            # bwrap runs as an unprivileged host uid and must traverse to the binds (not list).
            if d.stat().st_mode & 0o001 == 0:
                d.chmod(d.stat().st_mode | 0o711)
        become_subreaper()
        if self.settings.memory_merge:
            ksm.enable(self.settings.memory_merge_pages_to_scan)
        self.disk.open()
        self.reconcile()
        self._opened = True
        return self

    # -- helpers ------------------------------------------------------------------------------
    def _cg(self, sandbox_id: str) -> CgroupSet:
        return CgroupSet(sandbox_id, self._cgroup_group)

    @property
    def uid_base(self) -> int:
        return self.settings.uid_base

    def _sdir(self, sandbox_id: str) -> Path:
        if not NAME_RE.match(sandbox_id):
            raise SandboxNotFound(f"sandbox {sandbox_id!r} does not exist")
        return self.sandboxes_dir / sandbox_id

    @contextmanager
    def _locked(self, sandbox_id: str) -> Iterator[Path]:
        """Serialize operations on one sandbox across coroutines and processes."""
        d = self._sdir(sandbox_id)
        try:
            fd = os.open(d / "lock", os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SandboxNotFound(f"sandbox {sandbox_id!r} does not exist") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not (d / "state.json").exists():
                raise SandboxNotFound(f"sandbox {sandbox_id!r} does not exist")
            yield d
        finally:
            os.close(fd)

    def _load(self, d: Path) -> SandboxInfo:
        """The record in ``d``, parsed and validated once per version of its file (a listing
        loads every record), told by inode, size and ns times (``_save`` writes a new file)."""
        path = f"{d}/state.json"  # (str: a listing loads every record; pathlib's joins cost)
        version = _version(os.stat(path))
        cached = self._records.get(d.name)
        if cached is None or cached[0] != version:
            with open(path) as f:
                cached = (version, SandboxInfo.from_json(json.load(f), d))
            self._records[d.name] = cached
        return dataclasses.replace(cached[1], extra=dict(cached[1].extra))

    def _save(self, info: SandboxInfo) -> None:
        path = info.dir / "state.json"
        raw = info.to_json()
        atomic_write(path, json.dumps(raw))
        # (cached as a load reads it: the next request's ``peek`` finds it)
        self._records[info.id] = (_version(os.stat(path)), SandboxInfo.from_json(raw, info.dir))

    def agent_lib(self) -> Path:
        """The read-only copy of the agent's code that new sandboxes run (see agentlib)."""
        return self._agent_lib.path()

    def workspace_path(self, workspace_id: str) -> Path:
        if not NAME_RE.match(workspace_id):
            raise InvalidRequest(f"workspace id {workspace_id!r} is not valid")
        return self.workspaces_dir / workspace_id

    def _prepare_workspace(self, workspace_id: str | None, directory: Path | None = None) -> Path:
        ws = directory or self.workspace_path(str(workspace_id))
        ws.mkdir(mode=0o755, exist_ok=True)
        owner = self.uid_base + SANDBOX_USER_UID
        st = ws.stat()
        if st.st_uid != owner:
            os.chown(ws, owner, owner)
        return ws

    # -- lifecycle ------------------------------------------------------------------------------
    def create(
        self, spec: SandboxSpec | dict[str, object], extra: dict[str, object] | None = None,
        layer_image: Path | None = None, template: Template | None = None,
    ) -> SandboxInfo:  # fmt: skip
        """Create and start a sandbox; returns once its agent answers (and its template's
        start command is ready). ``extra`` is stored with the record for upper layers (e.g.
        the E2B server's timeout and tokens); ``layer_image`` is a writable layer to start from
        (a filesystem snapshot's); ``template`` one not in the store (a build's, build.py)."""
        if not isinstance(spec, SandboxSpec):
            try:
                spec = SandboxSpec.model_validate(spec)
            except ValidationError as e:
                raise InvalidRequest(validation_message(e)) from None
        if shutil.which("bwrap") is None:
            raise HostUnsupported("bubblewrap is not installed (apt-get install bubblewrap)")
        template = template or self.templates.get(spec.template)
        spec = self.disk.resolve(spec, template)
        self.wsdisk.check(spec)
        for m in spec.mounts:
            mounts.check_traversable(m.source)
        if layer_image is None and (pooled := self.pools.take(spec, template, extra or {})):
            return pooled
        if layer_image is None and (warm := self.warm.start(spec, template, extra or {})):
            return warm
        sandbox_id = new_sandbox_id()
        d = self.sandboxes_dir / sandbox_id
        # Held until the create is over: reconcile leaves a directory alone while it is held.
        claim = reconciling.claim(d)
        proc: subprocess.Popen[bytes] | None = None
        init_pid: int | None = None
        try:
            host_uid = self._prepare_root(d, spec, template, layer_image)
            proc, init_pid, workspace, spec = boot(self, d, spec, template, host_uid)
            info = SandboxInfo(
                id=sandbox_id,
                template=template.name,
                state="running",
                spec=spec,
                created_at=time.time(),
                pid=proc.pid,
                init_pid=init_pid,
                dir=d,
                workspace=workspace,
                extra=dict(extra or {}),
                host_uid=host_uid,
            )
            self._save(info)
            self._children[sandbox_id] = proc
            if any(svc.get("ready_cmd") for svc in template.services):
                wait_ready(info, template)  # handed out with its start command serving
            return info
        except BaseException:
            self._destroy(sandbox_id, init_pid)
            if proc is not None:
                proc.wait()
            raise
        finally:
            os.close(claim)

    def _prepare_root(
        self, d: Path, spec: SandboxSpec, template: Template, layer_image: Path | None = None
    ) -> int:
        """A new sandbox's uid range, cgroups, writable layer (``layer_image``'s copy, or an
        empty one), copy-on-write root and host directories; returns its first host id."""
        host_uid = self.uids.allocate(d.name)
        (d / UID_FILE).write_text(str(host_uid))  # what destroy gives back
        self._cg(d.name).create(spec.limits.memory_mb, spec.limits.cpu, spec.limits.pids)
        layer = self.disk.prepare(d, spec, layer_image)  # its own filesystem, of the budget
        if layer_image is not None:
            self.uids.shift_tree(layer.upper.parent, host_uid)  # another range wrote it
        with self.uids.lower(template.lowers(), host_uid) as lower:
            mounts.mount_overlay(lower, layer.upper, layer.work, d / "root")
        run_dir = d / "run"
        run_dir.mkdir(mode=0o700)
        os.chown(run_dir, host_uid, host_uid)
        # A tmpfs of its own: bound in, its root shows as "/", not as a path of the data dir.
        mounts.mount_tmpfs(d / checkpoint.HANDOFF, 64 << 10, 0o755)
        return host_uid

    def _destroy(self, sandbox_id: str, init_pid: int | None = None) -> None:
        """Remove every trace of a sandbox; safe to call on a half-created one."""
        d = self.sandboxes_dir / sandbox_id
        self._records.pop(sandbox_id, None)
        cg = self._cg(sandbox_id)
        cg.kill_all()
        proc = self._children.pop(sandbox_id, None)
        if proc is not None:
            proc.wait()  # bwrap, our child if this process created the sandbox
        reap_init(init_pid)
        cg.remove()
        self.uids.give_back(d)
        self.wsdisk.release(d)  # after the views of it, before the range is given back
        mounts.umount(d / "root")
        mounts.umount(d / checkpoint.HANDOFF)
        self.disk.release(d)
        had_egress = (d / "egress.json").exists()
        if had_egress:
            self.egress.forget(d)
        host_uid = None
        with suppress(FileNotFoundError, ValueError):
            host_uid = int((d / UID_FILE).read_text())
        reconciling.remove_dir(d)  # the lock file last: reconcile tells debris by it
        if host_uid is not None:  # nothing it owned is left: its processes, layer, views
            self.uids.release(host_uid, sandbox_id)
        if had_egress:
            try:
                self.egress.sync(start=False)  # close its socket; the daemon exits after the last
            except SandholdError as e:
                log.warning("egress daemon sync after removing %s failed: %s", sandbox_id, e)

    def kill(self, sandbox_id: str) -> None:
        """Kill a sandbox and remove it (a failed one too: its mounts, cgroups, directory)."""
        with self._locked(sandbox_id) as d:
            info = self._load(d)
            # From here on the sandbox no longer exists for others; should we be interrupted, the
            # marker tells the next reconcile to finish the job at once.
            (d / "state.json").rename(d / "killing.json")
            # A failed or suspended sandbox's init is gone and its pid may be someone else's.
            gone = info.state == "failed" or info.suspended
            self._destroy(sandbox_id, None if gone else info.init_pid)

    def pause(self, sandbox_id: str) -> SandboxInfo:
        with self._locked(sandbox_id) as d:
            info = self._load(d)
            _refuse_failed(info)
            if info.state == "paused":
                raise Conflict(f"sandbox {sandbox_id} is already paused")
            self._cg(sandbox_id).freeze()
            info.state = "paused"
            info.paused_at = time.time()
            self._save(info)
            return info

    def resume(self, sandbox_id: str) -> SandboxInfo:
        with self._locked(sandbox_id) as d:
            info = self._load(d)
            _refuse_failed(info)
            if info.state == "running":
                raise Conflict(f"sandbox {sandbox_id} is already running")
            if info.suspended == suspend.DISK:
                suspend.restore(self, d, info)
            elif info.suspended == suspend.FILESYSTEM:
                suspend.cold_boot(self, d, info)
            else:
                self._cg(sandbox_id).thaw()
            info.state = "running"
            info.paused_at = None
            self._save(info)
            return info

    def suspend(self, sandbox_id: str) -> SandboxInfo:
        """Checkpoint a sandbox to disk (runtime/suspend.py): paused, no process, no memory."""
        return suspend.suspend(self, sandbox_id)

    def pause_filesystem(self, sandbox_id: str) -> SandboxInfo:
        """Pause without the memory: processes dropped, files kept (runtime/suspend.py)."""
        return suspend.drop_processes(self, sandbox_id)

    def fork(
        self, sandbox_id: str, extras: list[dict[str, object]]
    ) -> list[SandboxInfo | SandholdError]:
        """New sandboxes from one checkpoint of a running one (runtime/fork.py)."""
        return forking.fork(self, sandbox_id, extras)

    def update_network(
        self, sandbox_id: str, network: NetworkPolicy | dict[str, object]
    ) -> SandboxInfo:
        """Replace a running (or paused) sandbox's egress rules; the next connection it opens
        is judged by them. Mode ``none`` sandboxes have no proxy to configure."""
        if not isinstance(network, NetworkPolicy):
            try:
                network = NetworkPolicy.model_validate(network)
            except ValidationError as e:
                raise InvalidRequest(validation_message(e)) from None
        with self._locked(sandbox_id) as d:
            info = self._load(d)
            if (info.spec.network.mode == "none") != (network.mode == "none"):
                raise Conflict(
                    f"sandbox {sandbox_id} was created with network mode "
                    f"{info.spec.network.mode!r}; egress can be changed but not added or removed "
                    "on a running sandbox (create it with mode 'allowlist' and no rules to open "
                    "it later)"
                )
            info.spec = info.spec.model_copy(update={"network": network})
            self._save(info)
            if network.mode != "none":
                self.egress.write_policy(d, network, network.tenant, session_of(info.metadata),
                                         network.header_rules)  # fmt: skip
                self.egress.sync()
            return info

    def update_extra(self, sandbox_id: str, **values: object) -> SandboxInfo:
        """Attach small bookkeeping values (owned by upper layers) to a sandbox's record."""
        with self._locked(sandbox_id) as d:
            info = self._load(d)
            info.extra.update(values)
            self._save(info)
            return info

    # -- queries ------------------------------------------------------------------------------
    def get(self, sandbox_id: str) -> SandboxInfo:
        d = self._sdir(sandbox_id)
        try:
            info = self._load(d)
        except FileNotFoundError:
            raise SandboxNotFound(f"sandbox {sandbox_id!r} does not exist") from None
        if info.state != "failed" and not info.suspended and not self._alive(info):
            failed = self._reap(info)
            if failed is None:
                raise SandboxNotFound(f"sandbox {sandbox_id!r} does not exist")
            return failed
        return info

    def peek(self, sandbox_id: str) -> SandboxInfo | None:
        """``get`` of a running sandbox whose record is cached at its current version, with no
        lock, parse or wait (a stat and the cgroup's pid list): for the data plane's every
        request, on the event loop. None when finding out needs more (then ``get``)."""
        if not NAME_RE.match(sandbox_id):
            return None
        try:
            st = os.stat(self.sandboxes_dir / sandbox_id / "state.json")
        except OSError:
            return None
        cached = self._records.get(sandbox_id)
        if cached is None or cached[0] != _version(st):
            return None
        info = cached[1]
        if info.state != "running" or info.suspended or not self._alive(info):
            return None
        return dataclasses.replace(info, extra=dict(info.extra))

    def list(self) -> list[SandboxInfo]:
        out = []
        for name in sorted(os.listdir(self.sandboxes_dir)):
            try:
                out.append(self.get(name))
            except SandboxNotFound:
                continue
        return out

    def usage(self, sandbox_id: str) -> Usage:
        info = self.get(sandbox_id)
        try:
            u = self._cg(sandbox_id).usage()
        except FileNotFoundError:
            if info.state != "failed":
                raise
            u = dict.fromkeys(FAILED_USAGE_KEYS, 0)  # its cgroups went with a reboot
        disk = self.disk.usage(info.dir) or (dir_size(info.dir / "upper"), 0)
        return Usage(
            cpu_seconds=u["cpu_ns"] / 1e9,
            memory_bytes=u["memory_bytes"],
            memory_cache_bytes=u["memory_cache_bytes"],
            memory_limit_bytes=u["memory_limit_bytes"],
            oom_kills=u["oom_kills"],
            pids=u["pids"],
            disk_bytes=disk[0],
            disk_limit_bytes=disk[1],
            cpu_count=info.spec.limits.cpu,
        )

    def template_of(self, info: SandboxInfo) -> Template:
        return self.templates.get(info.template)

    # -- re-attachment and garbage --------------------------------------------------------------
    def _alive(self, info: SandboxInfo) -> bool:
        """Whether its agent (pid 1 inside) runs, judged by the cgroup, never by a bare pid (pids
        wrap and are reused): its pid among the cgroup's, not ending. Not any process of the
        cgroup: bwrap outlives a killed agent by a moment, and a call then reached a dead one."""
        proc = self._children.get(info.id)
        if proc is not None:
            proc.poll()  # reap bwrap if it exited, so it does not linger as a zombie
        return info.init_pid in self._cg(info.id).pids() and not ending(info.init_pid)

    def _reap(self, info: SandboxInfo) -> SandboxInfo | None:
        """A sandbox whose processes are gone though nobody killed it: its agent, pid 1 of its
        pid namespace, died (a bug; the host's OOM killer or root; a reboot), and the kernel
        took everything else with it. It is marked failed and otherwise left as it is (its
        files, mounts and cgroups, and the workspace, untouched) until it is killed. Returns
        the record, or None if it was killed meanwhile."""
        try:
            with self._locked(info.id) as d:
                info = self._load(d)
                if info.state == "failed" or info.suspended or self._alive(info):
                    return info
                bwrap = self._children.pop(info.id, None)  # exits with the agent's status
                info.state, info.failed_at = "failed", time.time()
                info.failure = self._failure(info.id, bwrap.wait() if bwrap else None)
                self._save(info)
        except SandboxNotFound:
            return None
        log.warning("sandbox %s failed: %s; kept until it is killed", info.id, info.failure)
        return info

    def _failure(self, sandbox_id: str, status: int | None) -> str:
        what = "its agent (pid 1) is gone"
        if status is not None:  # bwrap exits with its child's status, 128 + n for signal n
            what += f", exit status {status}"
            if status > 128:
                what += f" (signal {status - 128})"
        with suppress(OSError, ValueError, KeyError):
            if ooms := self._cg(sandbox_id).usage()["oom_kills"]:
                what += f"; {ooms} OOM kill(s) in the sandbox"
        return what

    def reconcile(self) -> reconciling.Report:
        """Re-attach to live sandboxes and clean up whatever a crash left half-created or
        half-killed, at any age, leaving creates in flight alone (see reconcile.py)."""
        return reconciling.reconcile(self)


UID_FILE = "uid"  # the first host id of the sandbox's range
FAILED_USAGE_KEYS = ("cpu_ns", "memory_bytes", "memory_cache_bytes", "memory_limit_bytes",
                     "oom_kills", "pids")  # fmt: skip


def _refuse_failed(info: SandboxInfo) -> None:
    if info.state == "failed":
        raise Conflict(f"sandbox {info.id} failed ({info.failure}); it can only be killed")


__all__ = [
    "Runtime", "SandboxInfo", "SandboxSpec", "State", "Usage", "new_sandbox_id", "session_of",
]  # fmt: skip
