"""``SandboxService``: create, connect/resume, pause, kill, list, timeouts, network and metrics
of sandboxes on this host, for any surface. See the package docstring."""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Iterable
from typing import Any

import httpx
from pydantic import ValidationError

from sandhold.config import Settings
from sandhold.envd import ENVD_PORT
from sandhold.envd.client import EnvdClient
from sandhold.envd.transports import agent_channel
from sandhold.errors import (
    Conflict,
    GuestUnresponsive,
    IdempotencyMismatch,
    InvalidRequest,
    PreconditionFailed,
    SandboxNotFound,
)
from sandhold.isotime import iso
from sandhold.runtime.records import SandboxInfo
from sandhold.runtime.runtime import Runtime
from sandhold.runtime.spec import NetworkPolicy, SandboxSpec, validation_message
from sandhold.runtime.templates.build import kill_leftovers
from sandhold.service.builds import Builds
from sandhold.service.fleet import stamp as fleet_stamp
from sandhold.service.limits import check_create
from sandhold.service.locks import KeyedLocks
from sandhold.service.metrics import Failures, Sample, Samples, sampling
from sandhold.service.offload import Offload
from sandhold.service.pooler import Pooler
from sandhold.service.prom import ServiceMetrics
from sandhold.service.records import RECORD_KEY, CreateSandbox, Lifecycle, RecordCache, Sandbox
from sandhold.service.snapshots import find as find_snapshot
from sandhold.service.snapshots import start as start_snapshot
from sandhold.service.suspender import Suspender
from sandhold.service.timers import Periodic, Timer
from sandhold.service.warmer import WARM_CHECK_S, Warmer

REFRESH_MIN_S = 15
HEALTH_TIMEOUT_S = 5.0  # a strict pause's health check of the agent (the SDK's own probe: 5 s)


def not_found(sandbox_id: str) -> SandboxNotFound:
    # Also what another owner gets: the existence of foreign sandboxes is not revealed.
    return SandboxNotFound(f"sandbox {sandbox_id!r} doesn't exist or you don't have access to it")


class SandboxService:
    def __init__(self, runtime: Runtime, settings: Settings, *, timers: bool = True) -> None:
        self.runtime = runtime
        self.settings = settings
        self._locks = KeyedLocks()
        self._records = RecordCache()
        self.offload = Offload()
        self.samples = Samples(0, lambda i: self.offload.run(self.runtime.usage, i))
        self.failures = Failures(time.time())  # before open(): its reconcile may find some
        self.disk_total = 0
        # GET /metrics (service/prom.py); its suspend gauge asks the suspender, made next, which
        # observes its suspends here.
        self.prom = ServiceMetrics(runtime, settings, self.failures, lambda: self.suspender.enabled)
        self.suspender = Suspender(
            runtime, settings, self.offload, self.prom, lock=self.lock, list_now=self.list_now
        )
        self.builds = Builds(runtime, settings, self.offload)
        self.warmer = Warmer(runtime, settings, self.offload)
        self.pooler = Pooler(runtime.pools, settings, self.offload)
        # The upkeep in the background: none at all with timers=False (a service that only
        # reads, as bench/listing_bench.py's); the pools are kept filled only with it.
        self.jobs: list[Periodic | Timer] = self._jobs() if timers else []

    def _jobs(self) -> list[Periodic | Timer]:
        s = self.settings
        return [
            Timer(self.query, self.expire, s.lifecycle_interval_s),
            # Half-made sandboxes of a crash (of any process on this data dir) are cleaned
            # while we run, not only at the next start.
            Periodic(
                lambda: self.offload.run(self.runtime.reconcile),
                s.reconcile_interval_s,
                "sandhold-reconcile",
            ),
            Periodic(
                self.suspender.tick, min(5.0, max(s.suspend_after_s, 0.5)), "sandhold-suspend"
            ),
            Periodic(self.warmer.tick, WARM_CHECK_S, "sandhold-warm", at_start=True),
            *sampling(s.server_console_sample_interval_s, self.query, self.samples),
        ]

    async def open(self) -> SandboxService:
        """Open the runtime (re-attach, clean up), build ``base`` and the agent's library before
        the first create (concurrent first creates would each build them), start the jobs."""
        await self.offload.run(self.runtime.open)
        await self.offload.run(self.runtime.templates.get, "base")
        await self.offload.run(self.runtime.agent_lib)
        await self.offload.run(kill_leftovers, self.runtime)  # builds never outlive their server
        await self.offload.run(self.builds.prune)
        st = os.statvfs(self.settings.data_dir)
        self.disk_total = st.f_blocks * st.f_frsize
        self.samples.disk_total = self.disk_total
        for job in self.jobs:
            job.start()
        if self.jobs:  # the pools are upkeep too: left alone with timers=False
            await self.pooler.start()
        return self

    async def close(self) -> None:
        """Stop the jobs and wait for runtime work already started: a kill cut short would
        leave a half-removed sandbox behind. Sandboxes themselves are left as they are."""
        for job in self.jobs:
            await job.stop()
        await self.warmer.close()
        if self.jobs:
            await self.pooler.close()
        await self.builds.close()
        await self.offload.close()

    def lock(self, sandbox_id: str) -> contextlib.AbstractAsyncContextManager[None]:
        return self._locks(sandbox_id)

    # -- reading -------------------------------------------------------------------------------
    def _get_now(self, sandbox_id: str) -> Sandbox | None:
        try:
            info = self.runtime.get(sandbox_id)
        except SandboxNotFound:
            return None
        self.failures.observe(info)
        return self._records(info)

    def list_now(self) -> list[SandboxInfo]:
        """Every sandbox's record, read now (blocking: run it through ``offload``); failures
        are counted and the views of the gone forgotten."""
        everything = self.runtime.list()
        for info in everything:
            self.failures.observe(info)
        self.failures.prune(lambda i: not (self.runtime.sandboxes_dir / i).exists())
        self._records.keep_only({info.id for info in everything})
        return everything

    async def get(self, sandbox_id: str) -> Sandbox | None:
        return await self.offload.run(self._get_now, sandbox_id)

    def peek(self, sandbox_id: str) -> Sandbox | None:
        """A running sandbox known at its current version, without a thread (``Runtime.peek``);
        None: ask ``get``."""
        info = self.runtime.peek(sandbox_id)
        return self._records(info) if info is not None else None

    async def owned(self, owner: str, sandbox_id: str) -> Sandbox:
        sbx = await self.get(sandbox_id)
        if sbx is None or sbx.owner != owner:
            raise not_found(sandbox_id)
        return sbx

    async def usable(self, owner: str, sandbox_id: str) -> Sandbox:
        """``owned``, for a call that would use it: a failed sandbox is not found (it is only
        listed, read and killed)."""
        sbx = await self.owned(owner, sandbox_id)
        if sbx.failed:
            raise SandboxNotFound(
                f"sandbox {sandbox_id!r} failed ({sbx.info.failure}) and cannot be used; it is "
                "kept (its files too) until it is killed"
            )
        return sbx

    async def query(
        self,
        owner: str | None = None,
        *,
        states: Iterable[str] = ("running", "paused"),
        metadata: dict[str, str] | None = None,
    ) -> list[Sandbox]:
        """Sandboxes of ``owner`` (everyone's when None) in ``states`` whose metadata has all
        the given pairs."""
        wanted, pairs = set(states), (metadata or {}).items()
        everything = await self.offload.run(self.list_now)
        return [
            s
            for s in map(self._records, everything)
            if s is not None
            and (owner is None or s.owner == owner)
            and s.state in wanted
            and all(s.metadata.get(k) == v for k, v in pairs)
        ]

    async def _save(self, sbx: Sandbox) -> Sandbox:
        info = await self.offload.run(
            lambda: self.runtime.update_extra(sbx.id, **{RECORD_KEY: sbx.life.model_dump()})
        )
        return Sandbox(info, sbx.life)

    def check_timeout(self, timeout: int) -> None:
        if timeout <= 0:
            raise InvalidRequest("timeout must be a positive number of seconds")
        if timeout > self.settings.max_timeout_hours * 3600:
            raise InvalidRequest(
                f"Timeout cannot be greater than {self.settings.max_timeout_hours} hours"
            )

    # -- create --------------------------------------------------------------------------------
    async def create(self, req: CreateSandbox) -> Sandbox:
        """Create and start a sandbox; returns once its agent answers. With ``idempotency`` a
        repeated request returns the sandbox the first one made."""
        if req.idempotency is None:
            return await self._create(req)
        key, digest = req.idempotency
        async with self._locks((req.owner, key)):
            for sbx in await self.query(req.owner):
                if sbx.life.idempotency_key == key:
                    if sbx.life.idempotency_hash != digest:
                        raise IdempotencyMismatch(
                            "Idempotency-Key was already used with a different request"
                        )
                    return sbx
            return await self._create(req)

    async def _create(self, req: CreateSandbox) -> Sandbox:
        self.check_timeout(req.timeout_s)
        check_create(req, self.settings)
        if req.auto_resume and req.on_timeout != "pause":
            raise InvalidRequest("autoResume is only allowed with autoPause (on_timeout='pause')")
        if req.auto_resume and req.auto_pause_memory is False:
            raise InvalidRequest(
                "autoResume cannot be combined with a filesystem-only pause (autoPauseMemory)"
            )
        s, t0 = self.settings, time.perf_counter()
        req.template, made = await self.offload.run(self.builds.resolve, req.owner, req.template)
        try:
            spec = SandboxSpec.model_validate(
                {
                    "template": req.template,
                    "limits": {
                        "memory_mb": req.memory_mb or made.memory_mb or s.default_memory_mb,
                        "cpu": req.cpu or made.cpu or s.default_cpu,
                        "pids": req.pids or s.default_pids,
                        "disk_mb": req.disk_mb,
                    },
                    "env": {"E2B_TEAM_ID": req.owner, **req.env},  # (E2B's, with the runtime's
                    "metadata": req.metadata,  # E2B_SANDBOX_ID and E2B_TEMPLATE_ID)
                    "mounts": [
                        {"source": str(m.source), "target": m.target, "read_only": m.read_only}
                        for m in req.mounts
                    ],
                    "workspace_dir": req.workspace_dir,
                    "workspace_disk_mb": req.workspace_disk_mb,
                    "network": req.network.model_dump(),
                    "file_view": req.file_view,
                }
            )
        except ValidationError as e:
            raise InvalidRequest(f"invalid request: {validation_message(e)}") from None
        life = Lifecycle(
            owner=req.owner,
            access_token=secrets.token_urlsafe(32),
            traffic_token=None if req.public_traffic else secrets.token_urlsafe(32),
            timeout=req.timeout_s,
            end_at=time.time() + req.timeout_s,
            auto_pause=req.on_timeout == "pause",
            auto_pause_memory=req.auto_pause_memory,
            auto_resume=req.auto_resume,
            idempotency_key=req.idempotency[0] if req.idempotency else None,
            idempotency_hash=req.idempotency[1] if req.idempotency else None,
            surface=req.surface,
        )
        extra: dict[str, object] = {RECORD_KEY: life.model_dump()}
        given = fleet_stamp(extra, req.assigned)  # the id a fleet's edge chose (or None)
        exists = self.runtime.templates.exists(req.template)  # else a snapshot's id or name?
        snap = None if exists else await find_snapshot(self, req.owner, req.template)
        if snap is not None:
            info = await start_snapshot(self, snap, spec, extra, given)
        else:
            info = await self.offload.run(self.runtime.create, spec, extra, None, None, given)
            if self.jobs:  # no upkeep with timers=False: no checkpoints, no refills
                if info.started_from != "warm":
                    self.warmer.kick()  # a template that starts warm, without its checkpoint?
                self.pooler.kick()
        self.prom.created(info, time.perf_counter() - t0)
        return Sandbox(info, life)

    # -- lifecycle -----------------------------------------------------------------------------
    async def _resume(self, sbx: Sandbox, end_at: float) -> Sandbox:
        # endAt first: if we die in between, the sandbox is still paused, not running past its end.
        sbx.life.end_at = end_at
        await self._save(sbx)
        op = "restore" if sbx.info.suspended == "disk" else "resume"
        with self.prom.timed(op, sbx.info.suspended or "memory"):
            info = await self.offload.run(self.runtime.resume, sbx.id)
        return Sandbox(info, sbx.life)

    async def connect(
        self, owner: str, sandbox_id: str, timeout: int, *, memory: bool | None = None
    ) -> tuple[Sandbox, bool]:
        """Extend a running sandbox (never shorten), resume a paused one. Returns the sandbox
        and whether it was resumed."""
        self.check_timeout(timeout)
        async with self.lock(sandbox_id):
            sbx = await self.usable(owner, sandbox_id)
            now = time.time()
            if sbx.running:
                sbx.life.end_at = max(sbx.life.end_at, now + timeout)
                return await self._save(sbx), False
            if memory is False:  # on_resume="reboot": its memory dropped, a fresh boot
                await self.offload.run(self._drop_memory, sbx)
            return await self._resume(sbx, now + timeout), True

    async def resume(
        self,
        owner: str,
        sandbox_id: str,
        timeout: int,
        *,
        auto_pause: bool | None = None,
        memory: bool | None = None,
    ) -> Sandbox:
        """Resume a paused sandbox (Conflict for a running one)."""
        self.check_timeout(timeout)
        async with self.lock(sandbox_id):
            sbx = await self.usable(owner, sandbox_id)
            if sbx.running:
                raise Conflict(f"sandbox {sbx.id!r} is already running")
            if memory is False:
                await self.offload.run(self._drop_memory, sbx)
            if auto_pause is not None:
                sbx.life.auto_pause = auto_pause
            return await self._resume(sbx, time.time() + timeout)

    async def set_timeout(self, owner: str, sandbox_id: str, timeout: int) -> None:
        """A running sandbox ends ``timeout`` seconds from now; 0 ends it at once (E2B's
        documented behaviour: its timer fires, so the sandbox is killed or paused as it was
        created to be). A negative timeout is refused and changes nothing (E2B reads it as 0,
        which makes a typo kill the sandbox)."""
        if timeout < 0:
            raise InvalidRequest(
                f"timeout must not be negative, got {timeout}: give the seconds the sandbox "
                "should live from now (0 ends it now)"
            )
        if timeout > self.settings.max_timeout_hours * 3600:
            self.check_timeout(timeout)
        async with self.lock(sandbox_id):
            sbx = await self.usable(owner, sandbox_id)
            if not sbx.running:  # as in E2B: only running sandboxes have a timer
                raise not_found(sbx.id)
            sbx.life.end_at = time.time() + timeout
            await self._save(sbx)

    async def refresh(self, owner: str, sandbox_id: str, duration: int | None) -> None:
        """Keep a running sandbox at least ``duration`` (at least 15) more seconds."""
        duration = max(duration or REFRESH_MIN_S, REFRESH_MIN_S)
        async with self.lock(sandbox_id):
            sbx = await self.usable(owner, sandbox_id)
            if not sbx.running:
                raise not_found(sbx.id)
            sbx.life.end_at = max(sbx.life.end_at, time.time() + duration)
            await self._save(sbx)

    async def pause(
        self,
        owner: str,
        sandbox_id: str,
        *,
        memory: bool | None = None,
        require_healthy: bool = False,
    ) -> None:
        """Pause a running sandbox (Conflict for a paused one): its memory kept (suspended to
        disk later: suspender.py), or with ``memory=False`` dropped (a filesystem-only pause:
        its files kept, resume boots it afresh). ``require_healthy`` (E2B's strict pause): only
        if its agent answers its health check now, else GuestUnresponsive and it keeps running."""
        async with self.lock(sandbox_id):
            sbx = await self.usable(owner, sandbox_id)
            if not sbx.running:
                raise Conflict(f"sandbox {sbx.id!r} is already paused")
            if require_healthy and not await self._agent_answers(sbx):
                raise GuestUnresponsive(
                    f"sandbox {sbx.id!r} was not paused (requireHealthyGuest): its agent (envd) "
                    f"did not answer its health check within {HEALTH_TIMEOUT_S:g} s; it keeps "
                    "running"
                )
            with self.prom.timed("pause", "filesystem" if memory is False else "memory"):
                await self.offload.run(
                    self.runtime.pause if memory is not False else self.runtime.pause_filesystem,
                    sbx.id,
                )
            if memory is False:
                return
        if self.settings.suspend_after_s == 0 and self.suspender.enabled:
            await self.suspender.suspend(sandbox_id)

    async def kill(
        self,
        owner: str,
        sandbox_id: str,
        *,
        if_state: str | None = None,
        if_end_at: float | None = None,
    ) -> None:
        """Kill a sandbox; with ``if_state``/``if_end_at`` only if it is still in that state with
        that end time (PreconditionFailed otherwise), checked under the sandbox's lock so that no
        resume can slip in between: the gateway's reclaimer never kills a sandbox resumed since
        it looked."""
        async with self.lock(sandbox_id):
            sbx = await self.owned(owner, sandbox_id)
            if if_state is not None and sbx.state != if_state:
                raise PreconditionFailed(f"sandbox {sbx.id!r} is {sbx.state}, not {if_state}")
            if if_end_at is not None and abs(sbx.end_at - if_end_at) > 1e-3:
                raise PreconditionFailed(
                    f"sandbox {sbx.id!r} has changed since endAt {iso(if_end_at)}"
                )
            await self._kill(sbx.id, sbx.info.state)

    async def _kill(self, sandbox_id: str, state: str) -> None:
        with contextlib.suppress(SandboxNotFound), self.prom.timed("kill", state):
            await self.offload.run(self.runtime.kill, sandbox_id)
        self.samples.forget(sandbox_id)
        self.failures.forget(sandbox_id)

    def _drop_memory(self, sbx: Sandbox) -> None:
        """A paused sandbox's memory (frozen or on disk) dropped before a resume: it boots."""
        if sbx.info.suspended != "filesystem":
            self.runtime.pause_filesystem(sbx.id)

    async def suspends_to_disk(self) -> bool:
        """Whether paused sandboxes are checkpointed to disk here after ``suspend_after_s``:
        CRIU is usable (``criu check`` runs once per process) and the setting is not negative."""
        return await self.offload.run(lambda: self.suspender.enabled)

    async def _agent_answers(self, sbx: Sandbox) -> bool:
        """Whether the sandbox's agent answers ``GET /health`` (on its socket) in time."""
        try:
            async with agent_channel(sbx.info.agent_socket, ENVD_PORT, HEALTH_TIMEOUT_S) as ch:
                return await EnvdClient(ch).health()
        except (httpx.HTTPError, OSError):
            return False

    async def set_network(
        self, owner: str, sandbox_id: str, policy: NetworkPolicy, **surface: Any
    ) -> Sandbox:
        """Replace a sandbox's egress policy (its next connection is judged by it) and, with
        ``surface``, update the surface's echo of it in the same step."""
        async with self.lock(sandbox_id):
            sbx = await self.usable(owner, sandbox_id)
            info = await self.offload.run(self.runtime.update_network, sbx.id, policy)
            sbx = Sandbox(info, sbx.life)
            if surface:
                sbx.life.surface = {**sbx.life.surface, **surface}
                sbx = await self._save(sbx)
            return sbx

    async def auto_resume(self, sandbox_id: str) -> Sandbox | None:
        """Traffic reached a paused sandbox: resume it if its owner asked for that."""
        async with self.lock(sandbox_id):
            sbx = await self.get(sandbox_id)
            if sbx is None or sbx.running:
                return sbx
            if sbx.failed or not sbx.life.auto_resume:
                return None
            timeout = max(sbx.life.timeout, self.settings.auto_resume_min_timeout_s)
            timeout = min(timeout, self.settings.max_timeout_hours * 3600)
            return await self._resume(sbx, time.time() + timeout)

    async def expire(self, sandbox_id: str) -> None:
        """Pause or kill a sandbox whose end time has passed, judged from its stored record (a
        failed one made to be killed is removed; one made to pause stays, as a paused one)."""
        async with self.lock(sandbox_id):
            sbx = await self.get(sandbox_id)
            if sbx is None or not sbx.expires or sbx.life.end_at > time.time():
                return
            if not sbx.life.auto_pause:
                await self._kill(sbx.id, sbx.info.state)
                return
            with contextlib.suppress(Conflict, SandboxNotFound):
                if sbx.life.auto_pause_memory is False:  # on_timeout mode "filesystem"
                    with self.prom.timed("pause", "filesystem"):
                        await self.offload.run(self.runtime.pause_filesystem, sbx.id)
                    return
                with self.prom.timed("pause", "memory"):
                    await self.offload.run(self.runtime.pause, sbx.id)
        if self.settings.suspend_after_s == 0 and self.suspender.enabled:
            await self.suspender.suspend(sandbox_id)

    # -- metrics -------------------------------------------------------------------------------
    async def sample(self, sbx: Sandbox) -> Sample:
        """Take one metrics sample of a sandbox now."""
        try:
            return await self.samples.take(sbx.id, sbx.info.created_at)
        except SandboxNotFound:
            raise not_found(sbx.id) from None

    def history(self, sandbox_id: str, start: int | None, end: int | None) -> list[Sample]:
        return self.samples.history(sandbox_id, start, end)


__all__ = ["SandboxInfo", "SandboxService", "not_found"]
