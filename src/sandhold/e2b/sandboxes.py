"""The E2B view of the runtime's sandboxes, and the only code of the server that changes them.

What E2B adds to a sandbox (owner team, tokens, timeout, ``endAt``, lifecycle flags) is kept in
the runtime's own record (``extra["e2b"]``), never only in memory: every decision (expire,
pause, auto-resume, connect) re-reads that record, so a restarted server carries on where the
old one stopped. Operations on one sandbox are serialized by a per-sandbox lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import os
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Coroutine, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from sandhold.config import Settings
from sandhold.e2b.errors import ApiError, from_sandhold, not_found
from sandhold.e2b.models import NetworkUpdate, NewSandbox, check_metadata, describe
from sandhold.e2b.network import SECRETS_SCOPE_KEY, egress_policy, secrets_tenant
from sandhold.e2b.volumes import VolumeStore
from sandhold.errors import Conflict, SandboxNotFound, SandholdError
from sandhold.runtime.runtime import ENVD_VERSION, Runtime, SandboxInfo
from sandhold.runtime.spec import NetworkPolicy, SandboxSpec

CLIENT_ID = "6532622b"  # legacy constant the API still returns
DEFAULT_TIMEOUT_S = 300
V1_DEFAULT_TIMEOUT_S = 15
REFRESH_MIN_S = 15
METRICS_HISTORY = 256
RUNTIME_THREADS = 16  # creates, kills, pauses and resumes in flight at once

T = TypeVar("T")


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


class E2bState(BaseModel):
    """What the E2B layer stores with a sandbox (``SandboxInfo.extra["e2b"]``)."""

    model_config = ConfigDict(extra="ignore")

    team: str
    envd_token: str
    traffic_token: str | None = None
    timeout: int  # the create timeout: auto-resume starts over with it
    end_at: float
    auto_pause: bool = False
    auto_pause_memory: bool | None = None
    auto_resume: bool = False
    allow_internet_access: bool | None = None
    network: dict[str, Any] | None = None
    volume_mounts: list[dict[str, str]] = []
    idempotency_key: str | None = None
    idempotency_hash: str | None = None


@dataclass
class Sandbox:
    info: SandboxInfo
    st: E2bState

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def running(self) -> bool:
        return self.info.state == "running"

    @property
    def end_at(self) -> float:
        # For a paused sandbox E2B reports when it was paused.
        if self.info.state == "paused" and self.info.paused_at:
            return self.info.paused_at
        return self.st.end_at

    def to_sandbox(self, domain: str | None) -> dict[str, Any]:
        return {
            "templateID": self.info.template,
            "sandboxID": self.id,
            "alias": self.info.template,
            "clientID": CLIENT_ID,
            "envdVersion": ENVD_VERSION,
            "envdAccessToken": self.st.envd_token,
            "trafficAccessToken": self.st.traffic_token,
            "domain": domain,
        }

    def to_listed(self, disk_size_mb: int) -> dict[str, Any]:
        limits = self.info.spec.limits
        return {
            "templateID": self.info.template,
            "alias": self.info.template,
            "sandboxID": self.id,
            "clientID": CLIENT_ID,
            "startedAt": iso(self.info.created_at),
            "endAt": iso(self.end_at),
            "cpuCount": max(1, math.ceil(limits.cpu)),
            "memoryMB": limits.memory_mb,
            "diskSizeMB": disk_size_mb,
            "metadata": self.info.metadata,
            "state": self.info.state,
            "envdVersion": ENVD_VERSION,
            "volumeMounts": self.st.volume_mounts,
        }

    def to_detail(self, disk_size_mb: int, domain: str | None) -> dict[str, Any]:
        out = self.to_listed(disk_size_mb)
        out.update(
            envdAccessToken=self.st.envd_token,
            allowInternetAccess=self.st.allow_internet_access,
            domain=domain,
            network={
                **(self.st.network or {}),
                "allowPublicTraffic": self.st.traffic_token is None,
            },
            lifecycle={
                "autoResume": self.st.auto_resume,
                "onTimeout": "pause" if self.st.auto_pause else "kill",
            },
        )
        if not self.running:
            out["pauseMode"] = "full"  # a frozen sandbox keeps its memory
        return out


def view(info: SandboxInfo) -> Sandbox | None:
    """The E2B view of a runtime sandbox; None for sandboxes this layer did not create."""
    raw = info.extra.get("e2b")
    if not isinstance(raw, dict):
        return None
    try:
        return Sandbox(info, E2bState.model_validate(raw))
    except ValidationError:
        return None


def short_id(sandbox_id: str) -> str:
    """Old SDKs address sandboxes as ``<id>-<clientID>``."""
    return sandbox_id.split("-", 1)[0]


class KeyedLocks:
    """One asyncio lock per key, dropped once nobody holds or awaits it: keys come from
    clients (any sandbox id, any idempotency key), so they must not pile up."""

    def __init__(self) -> None:
        self._locks: dict[Hashable, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def __call__(self, key: Hashable) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


HOST_MOUNT_KEY = "host-mount"  # CubeSandbox's reserved metadata key for host binds
# Sandhold's: {"read": [...], "write": [...]}, what the file API may touch (runtime FileView)
FILE_VIEW_KEY = "sandhold.file-view"


class Sandboxes:
    def __init__(self, runtime: Runtime, settings: Settings, volumes: VolumeStore) -> None:
        self.runtime = runtime
        self.settings = settings
        self.volumes = volumes
        self._locks = KeyedLocks()
        self._samples: dict[str, deque[dict[str, Any]]] = {}
        self._executor = ThreadPoolExecutor(RUNTIME_THREADS, thread_name_prefix="sandhold-rt")
        st = os.statvfs(settings.data_dir)
        self.disk_total = st.f_blocks * st.f_frsize
        self.disk_size_mb = self.disk_total // (1024 * 1024)

    async def off_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a runtime operation on a worker thread with a private event loop, so that its
        blocking parts (create mounts and waits for bwrap, kill waits for processes and removes
        directories, pause polls the freezer) never stall other traffic, and creates overlap
        (twice the creates per second on 2 CPUs). The runtime shares nothing loop-bound."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, asyncio.run, coro)

    async def drain(self) -> None:
        """Wait for runtime operations already started: the process is about to exit, and a
        kill cut short would leave a half-removed sandbox behind."""
        await asyncio.to_thread(self._executor.shutdown, True)

    @property
    def domain(self) -> str | None:
        return self.settings.public_domain

    def lock(self, sandbox_id: str) -> contextlib.AbstractAsyncContextManager[None]:
        return self._locks(short_id(sandbox_id))

    # -- reading ------------------------------------------------------------------------------
    def get(self, sandbox_id: str) -> Sandbox | None:
        try:
            return view(self.runtime.get(sandbox_id))
        except SandboxNotFound:
            return None

    def owned(self, team: str, sandbox_id: str) -> Sandbox:
        sandbox_id = short_id(sandbox_id)
        sbx = self.get(sandbox_id)
        if sbx is None or sbx.st.team != team:
            raise not_found(sandbox_id)
        return sbx

    def all(self) -> list[Sandbox]:
        return [s for s in map(view, self.runtime.list()) if s is not None]

    def _save(self, sbx: Sandbox) -> Sandbox:
        info = self.runtime.update_extra(sbx.id, e2b=sbx.st.model_dump())
        return Sandbox(info, sbx.st)

    def check_timeout(self, timeout: int) -> None:
        if timeout <= 0:
            raise ApiError(400, "timeout must be a positive number of seconds")
        if timeout > self.settings.max_timeout_hours * 3600:
            raise ApiError(
                400, f"Timeout cannot be greater than {self.settings.max_timeout_hours} hours"
            )

    # -- create -------------------------------------------------------------------------------
    async def create(
        self,
        team: str,
        body: NewSandbox,
        *,
        v1: bool,
        idempotency_key: str | None,
        limits: dict[str, Any] | None = None,
        network: NetworkPolicy | None = None,
    ) -> Sandbox:
        """``limits`` (memory_mb, cpu, pids) and ``network`` (the egress policy, whatever
        ``egress_e2b_enabled`` says) are for in-process callers that act for the operator, such
        as the gateway's local provider; over the API sandboxes get the server's defaults."""
        if idempotency_key is None:
            return await self._create(
                team, body, v1=v1, idempotency=None, limits=limits, network=network
            )
        digest = hashlib.sha256(body.model_dump_json().encode()).hexdigest()
        key = (team, idempotency_key)
        async with self._locks(key):
            for sbx in self.all():
                if sbx.st.team == team and sbx.st.idempotency_key == idempotency_key:
                    if sbx.st.idempotency_hash != digest:
                        raise ApiError(
                            422, "Idempotency-Key was already used with a different request"
                        )
                    return sbx
            return await self._create(team, body, v1=v1, idempotency=(idempotency_key, digest))

    async def _create(
        self,
        team: str,
        body: NewSandbox,
        *,
        v1: bool,
        idempotency: tuple[str, str] | None,
        limits: dict[str, Any] | None = None,
        network: NetworkPolicy | None = None,
    ) -> Sandbox:
        timeout = body.timeout
        if timeout is None:
            timeout = V1_DEFAULT_TIMEOUT_S if v1 else DEFAULT_TIMEOUT_S
        self.check_timeout(timeout)
        metadata = dict(body.metadata or {})
        check_metadata(metadata)
        workspace_dir, host_mounts = self._host_mounts(metadata.pop(HOST_MOUNT_KEY, None))
        file_view = _file_view(metadata.pop(FILE_VIEW_KEY, None))
        requested = body.network.model_dump(exclude_none=True) if body.network else {}
        tenant = secrets_tenant(team, metadata.pop(SECRETS_SCOPE_KEY, None))
        policy = network or egress_policy(
            self.settings, tenant, body.allow_internet_access, requested
        )
        if body.mcp:
            raise ApiError(400, "mcp is not supported by this server")
        if body.iam:
            raise ApiError(400, "iam (workload identity tokens) is not supported by this server")
        auto_resume = bool(body.autoResume and body.autoResume.enabled)
        if auto_resume and not body.autoPause:
            raise ApiError(400, "autoResume is only allowed with autoPause (on_timeout='pause')")
        if auto_resume and body.autoPauseMemory is False:
            raise ApiError(
                400, "autoResume cannot be combined with a filesystem-only pause (autoPauseMemory)"
            )
        mounts = host_mounts
        for m in body.volumeMounts or []:
            vol = self.volumes.by_name(team, m.name)
            mounts.append({"source": str(self.volumes.path(vol)), "target": m.path,
                           "read_only": False})  # fmt: skip
        try:
            spec = SandboxSpec.model_validate(
                {
                    "template": body.templateID,
                    "limits": limits
                    or {
                        "memory_mb": self.settings.default_memory_mb,
                        "cpu": self.settings.default_cpu,
                        "pids": self.settings.default_pids,
                    },
                    "env": body.envVars or {},
                    "metadata": metadata,
                    "mounts": mounts,
                    "workspace_dir": workspace_dir,
                    "network": policy.model_dump(),
                    "file_view": file_view,
                }
            )
        except ValidationError as e:
            raise ApiError(400, describe(e)) from None
        public = requested.get("allowPublicTraffic")
        if public is None:
            public = self.settings.public_traffic_default
        state = E2bState(
            team=team,
            envd_token=secrets.token_urlsafe(32),
            traffic_token=None if public else secrets.token_urlsafe(32),
            timeout=timeout,
            end_at=time.time() + timeout,
            auto_pause=body.autoPause,
            auto_pause_memory=body.autoPauseMemory,
            auto_resume=auto_resume,
            allow_internet_access=body.allow_internet_access,
            network=requested or None,
            volume_mounts=[m.model_dump() for m in body.volumeMounts or []],
            idempotency_key=idempotency[0] if idempotency else None,
            idempotency_hash=idempotency[1] if idempotency else None,
        )
        try:
            info = await self.off_loop(self.runtime.create(spec, extra={"e2b": state.model_dump()}))
        except SandholdError as e:
            raise from_sandhold(e) from None
        return Sandbox(info, state)

    def _host_mounts(self, raw: str | None) -> tuple[str | None, list[dict[str, Any]]]:
        """CubeSandbox's ``host-mount`` metadata: a JSON list of ``{hostPath, mountPath,
        readOnly}``. Only paths under ``host_mount_roots`` may be bound; ``/workspace`` becomes
        the sandbox's workspace, the rest plain mounts. Returns (workspace_dir, mounts)."""
        if raw is None:
            return None, []
        if not self.settings.host_mount_roots:
            raise ApiError(400, f"metadata {HOST_MOUNT_KEY!r} is not enabled on this server")
        try:
            items = json.loads(raw)
            if not isinstance(items, list):
                raise ValueError
            parsed = [
                (str(i["hostPath"]), str(i["mountPath"]), bool(i.get("readOnly", False)))
                for i in items
            ]
        except (ValueError, TypeError, KeyError):
            raise ApiError(
                400, f"metadata {HOST_MOUNT_KEY!r} must be a JSON list of {{hostPath, mountPath}}"
            ) from None
        roots = [r.resolve() for r in self.settings.host_mount_roots]
        workspace_dir, mounts = None, []
        for host_path, mount_path, read_only in parsed:
            real = Path(host_path).resolve()
            if not real.is_absolute() or not any(real.is_relative_to(r) for r in roots):
                raise ApiError(400, f"host-mount path {host_path!r} is outside the allowed roots")
            if not real.is_dir():
                raise ApiError(400, f"host-mount path {host_path!r} is not a directory")
            if mount_path.rstrip("/") == "/workspace":
                if read_only or workspace_dir is not None:
                    raise ApiError(400, "host-mount may bind one writable /workspace")
                workspace_dir = str(real)
            else:
                mounts.append({"source": str(real), "target": mount_path, "read_only": read_only})
        return workspace_dir, mounts

    # -- lifecycle ------------------------------------------------------------------------------
    async def _resume(self, sbx: Sandbox, end_at: float) -> Sandbox:
        # endAt first: if we die in between, the sandbox is still paused, not running past its end.
        sbx.st.end_at = end_at
        self._save(sbx)
        try:
            info = await self.off_loop(self.runtime.resume(sbx.id))
        except SandboxNotFound:
            raise not_found(sbx.id) from None
        return Sandbox(info, sbx.st)

    async def connect(
        self, team: str, sandbox_id: str, timeout: int | None, memory: bool | None
    ) -> tuple[Sandbox, bool]:
        """E2B's connect: extend a running sandbox (never shorten), resume a paused one.
        Returns the sandbox and whether it was resumed."""
        timeout = DEFAULT_TIMEOUT_S if timeout is None else timeout
        self.check_timeout(timeout)
        async with self.lock(sandbox_id):
            sbx = self.owned(team, sandbox_id)
            now = time.time()
            if sbx.running:
                sbx.st.end_at = max(sbx.st.end_at, now + timeout)
                return self._save(sbx), False
            if memory is False:
                raise ApiError(
                    400,
                    "resuming without memory (on_resume='reboot') is not supported: a paused "
                    "sandbox here keeps its memory and resumes from it",
                )
            return await self._resume(sbx, now + timeout), True

    async def resume(
        self, team: str, sandbox_id: str, timeout: int, auto_pause: bool | None, memory: bool | None
    ) -> Sandbox:
        """The v1 ``/resume``: like connect, but 409 for a running sandbox."""
        self.check_timeout(timeout)
        async with self.lock(sandbox_id):
            sbx = self.owned(team, sandbox_id)
            if sbx.running:
                raise ApiError(409, f"sandbox {sbx.id!r} is already running")
            if memory is False:
                raise ApiError(400, "resuming without memory is not supported")
            if auto_pause is not None:
                sbx.st.auto_pause = auto_pause
            return await self._resume(sbx, time.time() + timeout)

    async def set_timeout(self, team: str, sandbox_id: str, timeout: int) -> None:
        timeout = max(timeout, 0)
        if timeout > self.settings.max_timeout_hours * 3600:
            self.check_timeout(timeout)
        async with self.lock(sandbox_id):
            sbx = self.owned(team, sandbox_id)
            if not sbx.running:  # as in E2B: only running sandboxes have a timer
                raise not_found(sbx.id)
            sbx.st.end_at = time.time() + timeout
            self._save(sbx)

    async def refresh(self, team: str, sandbox_id: str, duration: int | None) -> None:
        duration = max(duration or REFRESH_MIN_S, REFRESH_MIN_S)
        async with self.lock(sandbox_id):
            sbx = self.owned(team, sandbox_id)
            if not sbx.running:
                raise not_found(sbx.id)
            sbx.st.end_at = max(sbx.st.end_at, time.time() + duration)
            self._save(sbx)

    async def pause(self, team: str, sandbox_id: str) -> None:
        async with self.lock(sandbox_id):
            sbx = self.owned(team, sandbox_id)
            if not sbx.running:
                raise ApiError(409, f"sandbox {sbx.id!r} is already paused")
            try:
                await self.off_loop(self.runtime.pause(sbx.id))
            except Conflict as e:
                raise ApiError(409, e.message) from None

    async def kill(
        self,
        team: str,
        sandbox_id: str,
        if_state: str | None = None,
        if_end_at: float | None = None,
    ) -> None:
        """Kill a sandbox; with ``if_state``/``if_end_at`` only if it is still in that state with
        that ``endAt`` (412 otherwise), checked under the sandbox's lock so that no resume can
        slip in between: the gateway's reclaimer never kills a sandbox resumed since it looked."""
        async with self.lock(sandbox_id):
            sbx = self.owned(team, sandbox_id)
            if if_state is not None and sbx.info.state != if_state:
                raise ApiError(412, f"sandbox {sbx.id!r} is {sbx.info.state}, not {if_state}")
            if if_end_at is not None and abs(sbx.end_at - if_end_at) > 1e-3:
                raise ApiError(412, f"sandbox {sbx.id!r} has changed since endAt {iso(if_end_at)}")
            await self._kill(sbx.id)

    async def _kill(self, sandbox_id: str) -> None:
        try:
            await self.off_loop(self.runtime.kill(sandbox_id))
        except SandboxNotFound:
            pass
        self._samples.pop(sandbox_id, None)

    async def update_network(self, team: str, sandbox_id: str, body: NetworkUpdate) -> None:
        """``PUT /sandboxes/{id}/network``: replace the egress rules (fields left out are
        cleared, as in E2B); the sandbox's next connection is judged by the new ones."""
        network = body.model_dump(exclude_none=True, exclude={"allow_internet_access"})
        async with self.lock(sandbox_id):
            sbx = self.owned(team, sandbox_id)
            if not self.settings.egress_e2b_enabled:
                raise ApiError(400, "egress is not enabled on this server: sandboxes have no "
                               "network access unless the operator sets "
                               "egress_e2b_enabled")  # fmt: skip
            tenant = sbx.info.spec.network.tenant or team  # as chosen at create
            policy = egress_policy(self.settings, tenant, body.allow_internet_access, network)
            if sbx.info.spec.network.mode == "none":
                raise ApiError(409, f"sandbox {sbx.id!r} was created without egress, so its "
                               "network cannot be changed (the operator disabled "
                               "egress_e2b_updatable)")  # fmt: skip
            if policy.mode == "none":
                policy = policy.model_copy(update={"mode": "allowlist"})
            sbx = await self._set_network(sbx, policy)
            sbx.st.allow_internet_access = body.allow_internet_access
            kept = {k: v for k, v in (sbx.st.network or {}).items()
                    if k in ("allowPublicTraffic", "maskRequestHost")}  # fmt: skip
            sbx.st.network = {**kept, **network} or None
            self._save(sbx)

    async def set_network(self, team: str, sandbox_id: str, policy: NetworkPolicy) -> None:
        """Replace the egress policy for an in-process caller acting for the operator (the
        gateway's local provider); 409 if the sandbox was created without egress or with."""
        async with self.lock(sandbox_id):
            await self._set_network(self.owned(team, sandbox_id), policy)

    async def _set_network(self, sbx: Sandbox, policy: NetworkPolicy) -> Sandbox:
        try:
            info = await self.off_loop(self.runtime.update_network(sbx.id, policy))
        except SandholdError as e:
            raise from_sandhold(e) from None
        return Sandbox(info, sbx.st)

    async def auto_resume(self, sandbox_id: str) -> Sandbox | None:
        """Traffic reached a paused sandbox: resume it if its owner asked for that."""
        async with self.lock(sandbox_id):
            sbx = self.get(sandbox_id)
            if sbx is None or sbx.running:
                return sbx
            if not sbx.st.auto_resume:
                return None
            timeout = max(sbx.st.timeout, self.settings.auto_resume_min_timeout_s)
            timeout = min(timeout, self.settings.max_timeout_hours * 3600)
            return await self._resume(sbx, time.time() + timeout)

    async def expire(self, sandbox_id: str) -> None:
        """Pause or kill a sandbox whose end time has passed, judged from its stored record."""
        async with self.lock(sandbox_id):
            sbx = self.get(sandbox_id)
            if sbx is None or not sbx.running or sbx.st.end_at > time.time():
                return
            if sbx.st.auto_pause:
                try:
                    await self.off_loop(self.runtime.pause(sbx.id))
                except (Conflict, SandboxNotFound):
                    pass
            else:
                await self._kill(sbx.id)

    # -- metrics ------------------------------------------------------------------------------
    async def sample(self, sbx: Sandbox) -> dict[str, Any]:
        """Take one metrics sample now; history is kept in memory only (it is not lifecycle
        state), so CPU percentages are relative to the previous sample or to the start."""
        try:
            usage = await asyncio.to_thread(self.runtime.usage, sbx.id)
        except SandboxNotFound:
            raise not_found(sbx.id) from None
        now = time.time()
        history = self._samples.setdefault(sbx.id, deque(maxlen=METRICS_HISTORY))
        if history:
            prev_t, prev_cpu = history[-1]["_t"], history[-1]["_cpu"]
        else:
            prev_t, prev_cpu = sbx.info.created_at, 0.0
        elapsed = max(now - prev_t, 1e-3)
        pct = (usage.cpu_seconds - prev_cpu) / elapsed / max(usage.cpu_count, 1e-3) * 100
        sample = {
            "timestamp": iso(now),
            "timestampUnix": int(now),
            "cpuCount": max(1, math.ceil(usage.cpu_count)),
            "cpuUsedPct": round(min(max(pct, 0.0), 100.0), 2),
            "memUsed": usage.memory_bytes,
            "memTotal": usage.memory_limit_bytes,
            "memCache": usage.memory_cache_bytes,
            "diskUsed": usage.disk_bytes,
            "diskTotal": self.disk_total,
            "_t": now,
            "_cpu": usage.cpu_seconds,
        }
        history.append(sample)
        return public_sample(sample)

    def history(self, sandbox_id: str, start: int | None, end: int | None) -> list[dict[str, Any]]:
        out = []
        for s in self._samples.get(sandbox_id, ()):
            if (start is None or s["timestampUnix"] >= start) and (
                end is None or s["timestampUnix"] <= end
            ):
                out.append(public_sample(s))
        return out


def public_sample(sample: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in sample.items() if not k.startswith("_")}


def _file_view(raw: str | None) -> dict[str, Any]:
    """The ``sandhold.file-view`` metadata: a JSON object ``{read, write}`` of sandbox paths."""
    if raw is None:
        return {}
    try:
        view = json.loads(raw)
    except ValueError:
        view = None
    if not isinstance(view, dict):
        raise ApiError(
            400, f"metadata {FILE_VIEW_KEY!r} must be a JSON object {{read: [...], write: [...]}}"
        )
    return view
