"""The runtime: creates, lists, pauses, resumes and destroys sandboxes on this host.

All state lives on disk under ``data_dir/sandboxes/<id>/state.json``; sandboxes are process trees
of their own (not children that die with us), so a new ``Runtime`` over the same ``data_dir``
re-attaches to every running and paused sandbox.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import time
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
from sandhold.runtime import assembly, cgroup_parent, ksm, liveness, mounts
from sandhold.runtime import reconcile as reconciling
from sandhold.runtime.agentlib import AgentLib
from sandhold.runtime.boot import boot
from sandhold.runtime.cgroup_files import Group
from sandhold.runtime.checkpoint import fork as forking
from sandhold.runtime.checkpoint import suspend
from sandhold.runtime.checkpoint.warm import WarmStarts, wait_ready
from sandhold.runtime.disk import DiskBudget
from sandhold.runtime.host import Host
from sandhold.runtime.pool import Pools
from sandhold.runtime.reaping import become_subreaper, pid_namespace
from sandhold.runtime.record_store import RecordStore
from sandhold.runtime.records import (
    SandboxInfo,
    State,
    Usage,
    dir_size,
    new_sandbox_id,
    session_of,
)
from sandhold.runtime.spec import NetworkPolicy, SandboxSpec, validation_message
from sandhold.runtime.templates.layers import LayerStore
from sandhold.runtime.templates.store import Template, TemplateStore
from sandhold.runtime.uids import UidPool
from sandhold.runtime.wsdisk import WorkspaceDisk


class Runtime:
    """The facade over this host's parts (``Host``, host.py): each operation takes the
    sandbox's lock and hands the parts to the module that does the work. Plain synchronous
    code: every call may block (flock, waits on processes, directory removal); the sandbox
    service is the one place that moves it off an event loop. Construct it, then ``open()``
    it before the first call."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = s = settings or get_settings()
        root = s.data_dir
        self.sandboxes_dir = root / "sandboxes"
        self.workspaces_dir = root / "workspaces"
        self.templates = TemplateStore(root / "templates", s.uid_base)
        self.egress = EgressControl(s)
        self.disk = DiskBudget(s)
        self.wsdisk = WorkspaceDisk(s, self.disk.cache, self.sandboxes_dir)
        self.uids = UidPool(s.uid_registry, root, s.uid_base, s.uid_ranges, s.uid_isolation)
        self.layers = LayerStore(self.templates.root / ".layers", self.uids)
        self.records = RecordStore(self.sandboxes_dir)
        self.host = Host(
            settings=s,
            records=self.records,
            templates=self.templates,
            layers=self.layers,
            uids=self.uids,
            disk=self.disk,
            wsdisk=self.wsdisk,
            egress=self.egress,
            agent_lib=AgentLib(root / "agentlib"),
            cgroup_group=cgroup_parent.name(s),  # read once: it never changes
        )
        self.warm = WarmStarts(self.host, self)
        self.pools = Pools(self.host, self)
        self._opened = False

    def open(self) -> Runtime:
        """Take charge of this host's sandboxes: become the subreaper of their processes,
        re-attach to running and paused ones, clean up what a crash left, restart egress."""
        if self._opened:
            return self
        root = self.settings.data_dir
        cgroup_parent.claim(self.settings, self.host.cgroup_group)  # before anything is made
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
    def cgroup(self, sandbox_id: str) -> Group:
        return self.host.cgroup(sandbox_id)

    @property
    def uid_base(self) -> int:
        return self.settings.uid_base

    def agent_lib(self) -> Path:
        """The read-only copy of the agent's code that new sandboxes run (see agentlib)."""
        return self.host.agent_lib.path()

    def workspace_path(self, workspace_id: str) -> Path:
        return assembly.workspace_path(self.host, workspace_id)

    # -- lifecycle ------------------------------------------------------------------------------
    def create(
        self,
        spec: SandboxSpec | dict[str, object],
        extra: dict[str, object] | None = None,
        layer_image: Path | None = None,
        template: Template | None = None,
        sandbox_id: str | None = None,
    ) -> SandboxInfo:
        """Create and start a sandbox; returns once its agent answers (and its template's
        start command is ready). ``extra`` is stored with the record for upper layers (e.g.
        the E2B server's timeout and tokens); ``layer_image`` is a writable layer to start from
        (a filesystem snapshot's); ``template`` one not in the store (a build's, build.py);
        ``sandbox_id`` an id given by the caller (a fleet's edge), else a new one."""
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
        given = sandbox_id is not None  # a pooled sandbox has an id of its own already
        if (
            not given
            and layer_image is None
            and (pooled := self.pools.take(spec, template, extra or {}))
        ):
            return pooled
        sandbox_id = assembly.free_id(self.host, sandbox_id)
        if layer_image is None and (
            warm := self.warm.start(spec, template, extra or {}, sandbox_id)
        ):
            return warm
        d = self.sandboxes_dir / sandbox_id
        # Held until the create is over: reconcile leaves a directory alone while it is held.
        claim = assembly.claim(d)
        proc: subprocess.Popen[bytes] | None = None
        init_pid: int | None = None
        try:
            host_uid = assembly.prepare_root(self.host, d, spec, template, layer_image)
            proc, init_pid, workspace, spec = boot(self.host, d, spec, template, host_uid)
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
                pid_ns=pid_namespace(),
            )
            self.records.save(info)
            self.host.children.add(sandbox_id, proc)
            if any(svc.get("ready_cmd") for svc in template.services):
                wait_ready(info, template)  # handed out with its start command serving
            return info
        except BaseException:
            assembly.destroy(self.host, sandbox_id, init_pid)
            if proc is not None:
                proc.wait()
            raise
        finally:
            os.close(claim)

    def kill(self, sandbox_id: str) -> None:
        """Kill a sandbox and remove it (a failed one too: its mounts, cgroups, directory)."""
        with self.records.locked(sandbox_id) as d:
            info = self.records.load(d)
            # From here on the sandbox no longer exists for others; should we be interrupted, the
            # marker tells the next reconcile to finish the job at once.
            (d / "state.json").rename(d / "killing.json")
            # A failed or suspended sandbox's init is gone and its pid may be someone else's.
            gone = info.state == "failed" or info.suspended
            assembly.destroy(self.host, sandbox_id, None if gone else info.init_pid)

    def pause(self, sandbox_id: str) -> SandboxInfo:
        with self.records.locked(sandbox_id) as d:
            info = self.records.load(d)
            _refuse_failed(info)
            if info.state == "paused":
                raise Conflict(f"sandbox {sandbox_id} is already paused")
            self.cgroup(sandbox_id).freeze()
            info.state = "paused"
            info.paused_at = time.time()
            self.records.save(info)
            return info

    def resume(self, sandbox_id: str) -> SandboxInfo:
        with self.records.locked(sandbox_id) as d:
            info = self.records.load(d)
            _refuse_failed(info)
            if info.state == "running":
                raise Conflict(f"sandbox {sandbox_id} is already running")
            if info.suspended == suspend.DISK:
                suspend.restore(self.host, d, info)
            elif info.suspended == suspend.FILESYSTEM:
                suspend.cold_boot(self.host, d, info)
            else:
                self.cgroup(sandbox_id).thaw()
            info.state = "running"
            info.paused_at = None
            self.records.save(info)
            return info

    def suspend(self, sandbox_id: str) -> SandboxInfo:
        """Checkpoint a sandbox to disk (checkpoint/suspend.py): paused, no process, no memory."""
        return suspend.suspend(self.host, sandbox_id)

    def pause_filesystem(self, sandbox_id: str) -> SandboxInfo:
        """Pause without the memory: processes dropped, files kept (checkpoint/suspend.py)."""
        return suspend.drop_processes(self.host, sandbox_id)

    def fork(
        self, sandbox_id: str, extras: list[dict[str, object]]
    ) -> list[SandboxInfo | SandholdError]:
        """New sandboxes from one checkpoint of a running one (runtime/checkpoint/fork.py)."""
        return forking.fork(self.host, sandbox_id, extras)

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
        with self.records.locked(sandbox_id) as d:
            info = self.records.load(d)
            if (info.spec.network.mode == "none") != (network.mode == "none"):
                raise Conflict(
                    f"sandbox {sandbox_id} was created with network mode "
                    f"{info.spec.network.mode!r}; egress can be changed but not added or removed "
                    "on a running sandbox (create it with mode 'allowlist' and no rules to open "
                    "it later)"
                )
            info.spec = info.spec.model_copy(update={"network": network})
            self.records.save(info)
            if network.mode != "none":
                self.egress.write_policy(
                    d, network, network.tenant, session_of(info.metadata), network.header_rules
                )
                self.egress.sync()
            return info

    def update_extra(self, sandbox_id: str, **values: object) -> SandboxInfo:
        """Attach small bookkeeping values (owned by upper layers) to a sandbox's record."""
        with self.records.locked(sandbox_id) as d:
            info = self.records.load(d)
            info.extra.update(values)
            self.records.save(info)
            return info

    # -- queries ------------------------------------------------------------------------------
    def get(self, sandbox_id: str) -> SandboxInfo:
        """The sandbox's record; one whose processes are gone is marked failed (liveness.py)."""
        return liveness.get(self.host, sandbox_id)

    def peek(self, sandbox_id: str) -> SandboxInfo | None:
        """``get`` of a running sandbox whose record is cached at its current version, with no
        lock, parse or wait (a stat and the cgroup's pid list): for the data plane's every
        request, on the event loop. None when finding out needs more (then ``get``)."""
        info = self.records.cached(sandbox_id)
        if info is None or info.state != "running" or info.suspended:
            return None
        if not liveness.alive(self.host, info):
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
            u = self.cgroup(sandbox_id).usage()
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

    # -- re-attachment and garbage --------------------------------------------------------------
    def reconcile(self) -> reconciling.Report:
        """Re-attach to live sandboxes and clean up whatever a crash left half-created or
        half-killed, at any age, leaving creates in flight alone (see reconcile.py)."""
        return reconciling.reconcile(self.host)


FAILED_USAGE_KEYS = (
    "cpu_ns",
    "memory_bytes",
    "memory_cache_bytes",
    "memory_limit_bytes",
    "oom_kills",
    "pids",
)


def _refuse_failed(info: SandboxInfo) -> None:
    if info.state == "failed":
        raise Conflict(f"sandbox {info.id} failed ({info.failure}); it can only be killed")


__all__ = [
    "Runtime",
    "SandboxInfo",
    "SandboxSpec",
    "State",
    "Usage",
    "new_sandbox_id",
    "session_of",
]
