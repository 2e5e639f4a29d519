"""The runtime: creates, lists, pauses, resumes and destroys sandboxes on this host.

All state lives on disk under ``data_dir/sandboxes/<id>/state.json``; sandboxes are process trees
of their own (not children that die with us), so a new ``Runtime`` over the same ``data_dir``
re-attaches to every running and paused sandbox.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import logging
import os
import secrets
import shutil
import string
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from sandhold.config import Settings, get_settings
from sandhold.errors import (
    Conflict,
    HostUnsupported,
    InvalidRequest,
    SandboxNotFound,
    SandboxStartFailed,
    SandholdError,
)
from sandhold.runtime import cgroups, mounts
from sandhold.runtime.cgroups import CgroupSet
from sandhold.runtime.launcher import Launch, spawn
from sandhold.runtime.spec import NAME_RE, NetworkPolicy, SandboxSpec
from sandhold.runtime.templates import SANDBOX_USER_UID, Template, TemplateStore

log = logging.getLogger(__name__)

State = Literal["running", "paused"]
ID_ALPHABET = string.ascii_lowercase + string.digits
ENVD_VERSION = "0.6.13"


def new_sandbox_id() -> str:
    """E2B-shaped ids: 20 characters of [a-z0-9] (hosts like ``49983-<id>.domain`` split on '-')."""
    return "".join(secrets.choice(ID_ALPHABET) for _ in range(20))


@dataclass
class SandboxInfo:
    id: str
    template: str
    state: State
    spec: SandboxSpec
    created_at: float
    pid: int  # host pid of bwrap (the tree's root, in the sandbox's cgroups)
    init_pid: int  # host pid of the sandbox's pid 1
    dir: Path
    workspace: Path | None
    paused_at: float | None = None
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def agent_socket(self) -> Path:
        return self.dir / "run" / "agent.sock"

    @property
    def metadata(self) -> dict[str, str]:
        return self.spec.metadata

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "template": self.template,
            "state": self.state,
            "spec": self.spec.model_dump(mode="json"),
            "created_at": self.created_at,
            "pid": self.pid,
            "init_pid": self.init_pid,
            "workspace": str(self.workspace) if self.workspace else None,
            "paused_at": self.paused_at,
            "extra": self.extra,
        }

    @classmethod
    def from_json(cls, d: dict[str, object], directory: Path) -> SandboxInfo:
        ws = d.get("workspace")
        return cls(
            id=str(d["id"]),
            template=str(d["template"]),
            state=d["state"],  # type: ignore[arg-type]
            spec=SandboxSpec.model_validate(d["spec"], context={"stored": True}),
            created_at=float(d["created_at"]),  # type: ignore[arg-type]
            pid=int(d["pid"]),  # type: ignore[call-overload]
            init_pid=int(d["init_pid"]),  # type: ignore[call-overload]
            dir=directory,
            workspace=Path(str(ws)) if ws else None,
            paused_at=d.get("paused_at"),  # type: ignore[arg-type]
            extra=dict(d.get("extra") or {}),  # type: ignore[call-overload]
        )


@dataclass
class Usage:
    cpu_seconds: float
    memory_bytes: int
    memory_cache_bytes: int
    memory_limit_bytes: int
    oom_kills: int
    pids: int
    disk_bytes: int
    cpu_count: float


def _dir_size(path: Path) -> int:
    total = 0
    for dirpath, _dirnames, filenames in os.walk(path):
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def _atomic_write(path: Path, text: str) -> None:
    # A temporary name of its own per writer: two writers (threads, processes) must never
    # share one and tear each other's record.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Runtime:
    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()
        root = self.settings.data_dir
        self.sandboxes_dir = root / "sandboxes"
        self.workspaces_dir = root / "workspaces"
        for d in (self.sandboxes_dir, self.workspaces_dir):
            d.mkdir(parents=True, exist_ok=True)
        for d in (root, self.sandboxes_dir, self.workspaces_dir):
            # bwrap runs as the unprivileged uid_base and must traverse to the binds (not list).
            if d.stat().st_mode & 0o001 == 0:
                d.chmod(d.stat().st_mode | 0o711)
        self.templates = TemplateStore(root / "templates", self.settings.uid_base)
        self._agent_lib_root = root / "agentlib"
        self._agent_lib_cached: tuple[tuple[tuple[str, int, int], ...], Path] | None = None
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        from sandhold.egress.control import EgressControl

        self.egress = EgressControl(self.settings)
        _become_subreaper()
        self.reconcile()

    # -- helpers ------------------------------------------------------------------------------
    def _cg(self, sandbox_id: str) -> CgroupSet:
        return CgroupSet(sandbox_id, self.settings.cgroup_group)

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
        return SandboxInfo.from_json(json.loads((d / "state.json").read_text()), d)

    def _save(self, info: SandboxInfo) -> None:
        _atomic_write(info.dir / "state.json", json.dumps(info.to_json()))

    def agent_lib(self) -> Path:
        """A read-only copy of the agent's code (and its one dependency, h11) for sandboxes.

        Keyed by content hash: running sandboxes keep the version they started with, and the
        copy carries compiled bytecode so the agent starts without compiling."""
        import h11

        agent_src = Path(__file__).parent / "agent"
        h11_src = Path(h11.__file__).parent
        files = sorted(agent_src.glob("*.py")) + sorted(h11_src.glob("*.py"))
        # Hashing the sources on every create cost ~2-4 ms: redo it only when a file changed.
        stamp = tuple((str(f), st.st_mtime_ns, st.st_size) for f in files for st in [f.stat()])
        cached = self._agent_lib_cached
        if cached is not None and cached[0] == stamp and cached[1].exists():
            return cached[1]
        digest = hashlib.sha256()
        for f in files:
            digest.update(f.name.encode() + f.read_bytes())
        target = self._agent_lib_root / digest.hexdigest()[:16]
        if target.exists():
            self._agent_lib_cached = (stamp, target)
            return target
        self._agent_lib_root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=self._agent_lib_root, prefix=".staging-"))
        pkg = staging / "sandhold"
        (pkg / "runtime" / "agent").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "runtime" / "__init__.py").write_text("")
        for f in agent_src.glob("*.py"):
            shutil.copy2(f, pkg / "runtime" / "agent" / f.name)
        shutil.copytree(h11_src, staging / "h11", ignore=shutil.ignore_patterns("__pycache__"))
        subprocess.run(["/usr/bin/python3", "-m", "compileall", "-q", str(staging)], check=False)
        for dirpath, dirnames, filenames in os.walk(staging):
            for n in (*dirnames, *filenames):
                os.chmod(os.path.join(dirpath, n), 0o755 if n in dirnames else 0o644)
        os.chmod(staging, 0o755)
        try:
            staging.rename(target)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)  # another process won the race
        self._agent_lib_cached = (stamp, target)
        return target

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
    async def create(
        self, spec: SandboxSpec | dict[str, object], extra: dict[str, object] | None = None
    ) -> SandboxInfo:
        """Create and start a sandbox; returns once its agent answers. ``extra`` is stored with
        the record for upper layers (e.g. the E2B server's timeout and tokens)."""
        if not isinstance(spec, SandboxSpec):
            try:
                spec = SandboxSpec.model_validate(spec)
            except ValidationError as e:
                raise InvalidRequest(_validation_message(e)) from None
        if shutil.which("bwrap") is None:
            raise HostUnsupported("bubblewrap is not installed (apt-get install bubblewrap)")
        template = self.templates.get(spec.template)
        for m in spec.mounts:
            _check_traversable(m.source)
        sandbox_id = new_sandbox_id()
        d = self.sandboxes_dir / sandbox_id
        d.mkdir()
        (d / "lock").touch()
        cg = self._cg(sandbox_id)
        proc: subprocess.Popen[bytes] | None = None
        init_pid: int | None = None
        ready_r, ready_w = os.pipe()
        try:
            cg.create(spec.limits.memory_mb, spec.limits.cpu, spec.limits.pids)
            root = d / "root"
            mounts.mount_overlay(template.rootfs, d / "upper", d / "work", root)
            run_dir = d / "run"
            run_dir.mkdir(mode=0o700)
            os.chown(run_dir, self.uid_base, self.uid_base)
            workspace = None
            if spec.workspace_id or spec.workspace_dir:
                workspace = self._prepare_workspace(spec.workspace_id, spec.workspace_dir)
            binds: list[tuple[str, str, bool]] = []
            if workspace:
                binds.append((str(workspace), "/workspace", False))
            for m in spec.mounts:
                _make_mount_point(root, m.target, self.uid_base)
                binds.append((str(m.source), m.target, m.read_only))
            egress_env: dict[str, str] = {}
            egress_agent: dict[str, object] | None = None
            if spec.network.mode != "none":
                from sandhold.egress import control as egress

                binds += self.egress.prepare(d, spec.network, spec.network.tenant,
                                             session_of(spec.metadata))  # fmt: skip
                self.egress.sync()  # the sandbox's socket listens before the sandbox starts
                egress_env, egress_agent = egress.sandbox_env(), egress.agent_config()
            env = {**template.env, **egress_env, **spec.env}
            agent_cfg = {
                "socket": "/run/sandhold/agent.sock",
                "default_user": spec.user or template.user,
                "default_workdir": spec.workdir or template.workdir,
                "env": env,
                "ready_fd": ready_w,
                "envd_version": ENVD_VERSION,
                "services": template.services,
                "egress": egress_agent,
                "file_view": {
                    **spec.file_view.model_dump(),
                    "read_only": [dst for _src, dst, ro in binds if ro]
                    + [dst for _src, dst in template.ro_binds],
                },
            }
            (run_dir / "agent.json").write_text(json.dumps(agent_cfg))
            launch = Launch(
                root=root,
                ro_binds=template.ro_binds,
                binds=binds,
                run_dir=run_dir,
                agent_lib=self.agent_lib(),
                env={"PATH": env.get("PATH", "/usr/bin:/bin"), "HOME": "/root", "LANG": "C.UTF-8"},
            )
            proc, init_pid = spawn(launch, cg, self.uid_base, ready_w, d / "sandbox.log")
            os.close(ready_w)
            ready_w = -1
            await self._wait_ready(ready_r, proc, d)
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
            )
            self._save(info)
            self._children[sandbox_id] = proc
            return info
        except BaseException:
            self._destroy(sandbox_id, init_pid)
            if proc is not None:
                proc.wait()
            raise
        finally:
            os.close(ready_r)
            if ready_w >= 0:
                os.close(ready_w)

    async def _wait_ready(self, fd: int, proc: subprocess.Popen[bytes], d: Path) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bytes] = loop.create_future()

        def on_readable() -> None:
            if not fut.done():
                try:
                    fut.set_result(os.read(fd, 64))
                except OSError as e:
                    fut.set_exception(e)

        os.set_blocking(fd, False)
        loop.add_reader(fd, on_readable)
        try:
            data = await asyncio.wait_for(fut, self.settings.ready_timeout_s)
        except TimeoutError:
            raise SandboxStartFailed(
                f"the sandbox agent was not ready within {self.settings.ready_timeout_s} s"
            ) from None
        finally:
            loop.remove_reader(fd)
        if not data.startswith(b"ready"):
            proc.poll()
            logtail = (d / "sandbox.log").read_text(errors="replace")[-2000:]
            raise SandboxStartFailed(f"the sandbox agent failed to start: {logtail.strip()}")

    @staticmethod
    def _reap_init(init_pid: int | None, timeout: float = 5.0) -> None:
        """Wait until the sandbox's pid 1 is gone. Its parent (bwrap outside) dies with it, so it
        is re-parented to us (we are a child subreaper) and must be reaped here."""
        if not init_pid:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if _parent_of(init_pid) != os.getpid():
                    raise ChildProcessError  # not adopted by us (yet), or a reused pid
                if os.waitpid(init_pid, os.WNOHANG)[0] == init_pid:
                    return
            except ChildProcessError:
                # Not (yet) ours. A zombie that is not ours is dead already: whoever adopted it
                # (the host's init, after a server restart) reaps it in its own time.
                try:
                    with open(f"/proc/{init_pid}/stat") as f:
                        if f.read().rpartition(")")[2].split()[0] == "Z":
                            return
                except FileNotFoundError:
                    return
            time.sleep(0.001)

    def _destroy(self, sandbox_id: str, init_pid: int | None = None) -> None:
        """Remove every trace of a sandbox; safe to call on a half-created one."""
        d = self.sandboxes_dir / sandbox_id
        cg = self._cg(sandbox_id)
        cg.kill_all()
        proc = self._children.pop(sandbox_id, None)
        if proc is not None:
            proc.wait()  # bwrap, our child if this process created the sandbox
        self._reap_init(init_pid)
        cg.remove()
        mounts.umount(d / "root")
        had_egress = (d / "egress.json").exists()
        if had_egress:
            self.egress.forget(d)
        shutil.rmtree(d, ignore_errors=True)
        if had_egress:
            try:
                self.egress.sync(start=False)  # close its socket; the daemon exits after the last
            except SandholdError as e:
                log.warning("egress daemon sync after removing %s failed: %s", sandbox_id, e)

    async def kill(self, sandbox_id: str) -> None:
        with self._locked(sandbox_id) as d:
            info = self._load(d)
            # From here on the sandbox no longer exists for others; should we be interrupted, the
            # marker tells the next reconcile to finish the job at once.
            (d / "state.json").rename(d / "killing.json")
            self._destroy(sandbox_id, info.init_pid)

    async def pause(self, sandbox_id: str) -> SandboxInfo:
        with self._locked(sandbox_id) as d:
            info = self._load(d)
            if info.state == "paused":
                raise Conflict(f"sandbox {sandbox_id} is already paused")
            self._cg(sandbox_id).freeze()
            info.state = "paused"
            info.paused_at = time.time()
            self._save(info)
            return info

    async def resume(self, sandbox_id: str) -> SandboxInfo:
        with self._locked(sandbox_id) as d:
            info = self._load(d)
            if info.state == "running":
                raise Conflict(f"sandbox {sandbox_id} is already running")
            self._cg(sandbox_id).thaw()
            info.state = "running"
            info.paused_at = None
            self._save(info)
            return info

    async def update_network(
        self, sandbox_id: str, network: NetworkPolicy | dict[str, object]
    ) -> SandboxInfo:
        """Replace a running (or paused) sandbox's egress rules; the next connection it opens
        is judged by them. Mode ``none`` sandboxes have no proxy to configure."""
        if not isinstance(network, NetworkPolicy):
            try:
                network = NetworkPolicy.model_validate(network)
            except ValidationError as e:
                raise InvalidRequest(_validation_message(e)) from None
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
                self.egress.write_policy(d, network, network.tenant, session_of(info.metadata))
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
        if not self._alive(info):
            self._reap(info)
            raise SandboxNotFound(f"sandbox {sandbox_id!r} has exited")
        return info

    def list(self) -> list[SandboxInfo]:
        out = []
        for d in sorted(self.sandboxes_dir.iterdir()):
            try:
                out.append(self.get(d.name))
            except SandboxNotFound:
                continue
        return out

    def usage(self, sandbox_id: str) -> Usage:
        info = self.get(sandbox_id)
        u = self._cg(sandbox_id).usage()
        disk = _dir_size(info.dir / "upper")
        return Usage(
            cpu_seconds=u["cpu_ns"] / 1e9,
            memory_bytes=u["memory_bytes"],
            memory_cache_bytes=u["memory_cache_bytes"],
            memory_limit_bytes=u["memory_limit_bytes"],
            oom_kills=u["oom_kills"],
            pids=u["pids"],
            disk_bytes=disk,
            cpu_count=info.spec.limits.cpu,
        )

    def template_of(self, info: SandboxInfo) -> Template:
        return self.templates.get(info.template)

    # -- re-attachment and garbage --------------------------------------------------------------
    def _alive(self, info: SandboxInfo) -> bool:
        """Judged by the cgroup, never by a pid: pids wrap (32768 here) and can be reused."""
        proc = self._children.get(info.id)
        if proc is not None:
            proc.poll()  # reap bwrap if it exited, so it does not linger as a zombie
        return bool(self._cg(info.id).pids())

    def _reap(self, info: SandboxInfo) -> None:
        log.warning("sandbox %s exited on its own; cleaning up", info.id)
        try:
            with self._locked(info.id):
                self._destroy(info.id, info.init_pid)
        except SandboxNotFound:
            pass

    def _mark_paused(self, sandbox_id: str) -> None:
        """A crash between freezing and recording left a frozen sandbox marked running."""
        try:
            with self._locked(sandbox_id) as d:
                info = self._load(d)
                if info.state != "paused" and self._cg(sandbox_id).freezer_state() == "FROZEN":
                    info.state = "paused"
                    self._save(info)
        except SandboxNotFound:
            pass

    def reconcile(self) -> None:
        """Re-attach to live sandboxes and clean up what a crash or a failed create left behind."""
        for d in list(self.sandboxes_dir.iterdir()):
            state = d / "state.json"
            if (d / "killing.json").exists():
                self._destroy(d.name)
                continue
            if not state.exists():
                # Either being created right now by another process, or debris of a crash.
                if time.time() - d.stat().st_mtime > 60:
                    self._destroy(d.name)
                continue
            try:
                info = self._load(d)
            except FileNotFoundError:
                continue  # killed meanwhile by another process
            except (ValueError, KeyError) as e:
                log.error("unreadable sandbox state %s (%s); removing it", d, e)
                self._destroy(d.name)
                continue
            if not self._alive(info):
                self._reap(info)
            elif self._cg(info.id).freezer_state() == "FROZEN" and info.state != "paused":
                self._mark_paused(info.id)
        if any((d / "egress.json").exists() for d in self.sandboxes_dir.iterdir()):
            try:
                self.egress.sync()  # re-attach: the daemon serves every egress sandbox again
            except SandholdError as e:
                log.error("egress daemon unavailable: %s", e)
        known = {d.name for d in self.sandboxes_dir.iterdir()}
        for name in cgroups.list_names(self.settings.cgroup_group):
            if name not in known:
                self._cg(name).kill_all()
                self._cg(name).remove()


def session_of(metadata: dict[str, str]) -> str | None:
    """The session a sandbox serves, for the egress audit log (the gateway's tag)."""
    for key, value in metadata.items():
        if key == "session_id" or key.endswith(".session_id"):
            return value
    return None


def _make_mount_point(root: Path, target: str, owner: int) -> None:
    """Create a bind target in the sandbox's root as sandbox root, mode 0755 (bwrap would make
    missing ones 0700, hiding the mount from `user`). Never through a symlink of the template:
    as host root that could create directories outside the sandbox."""
    path = root
    for part in target.strip("/").split("/"):
        path = path / part
        if path.is_symlink():
            raise InvalidRequest(f"mount target {target} goes through a symlink in the template")
        if not path.exists():
            path.mkdir(mode=0o755)
            os.lchown(path, owner, owner)


def _check_traversable(path: Path) -> None:
    """bwrap runs as the unprivileged uid_base: every parent of a bound directory must let
    others through, or the sandbox would fail to start with a less helpful message."""
    for parent in [*reversed(path.parents), path]:
        if not parent.stat().st_mode & 0o001:
            raise InvalidRequest(
                f"mount source {path} is not reachable by the sandbox's unprivileged owner: "
                f"{parent} is not searchable by others (chmod o+x)"
            )


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rpartition(")")[2].split()[1])
    except (FileNotFoundError, IndexError, ValueError):
        return None


def _become_subreaper() -> None:
    import ctypes

    pr_set_child_subreaper = 36
    ctypes.CDLL(None).prctl(pr_set_child_subreaper, 1, 0, 0, 0)


def _validation_message(e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "spec"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


__all__ = ["Runtime", "SandboxInfo", "SandboxSpec", "Usage", "new_sandbox_id"]
