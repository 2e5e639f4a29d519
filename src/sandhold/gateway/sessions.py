"""The SandboxSessionManager: maps each agent session to at most one sandbox of a provider.

Lifecycle (the three stages):

- **create** on the session's first tool call (or its ``prepare``, which a platform sends when
  the session starts, so that the sandbox is ready by the first call), never earlier: tagged
  with the session, tenant
  and gateway tags, the session's workspace bound at ``/workspace``, ``timeout`` = keep-alive,
  ``on_timeout=pause`` and ``auto_resume``;
- **keep-alive, then auto-pause**: each call extends the timeout (keep-alive + the call's own
  budget while it runs, the keep-alive again when the last call ends, set right after the call
  answers); the provider pauses the sandbox when it expires, and the next call resumes it;
- **reclaim**: see ``lifecycle.Reclaimer``.

Creating or adopting a sandbox is ``creates.py`` (this class's base).

Multi-replica safety rests on two things in the store: the per-session lease lock, held around
every change of a session's sandbox (create, adopt, resume, reclaim, close), with every write
under it fenced by the lock token; and ``session_uses`` rows, one per tool call in flight, which
the reclaimer must find empty before it kills. Nothing about a sandbox's lifecycle is kept in
this process's memory: a restarted replica reads the store and asks the provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sandhold.config import Settings
from sandhold.egress.policy import EgressPolicy
from sandhold.errors import (
    NotFound,
    SandholdError,
    SessionBusy,
    SessionClosed,
    SessionNotFound,
)
from sandhold.gateway.creates import SessionsBase, ms_since, traversable
from sandhold.gateway.handles import HandleSealer
from sandhold.gateway.keep_alive import KeepAlive
from sandhold.gateway.policy import SESSION_ID_RE, TenantPolicy, check_id
from sandhold.gateway.providers.base import (
    NeedsNewSandbox,
    Provider,
    ProviderError,
    ProviderSandbox,
    SandboxGone,
)
from sandhold.gateway.timeline import Timeline, stop_event
from sandhold.runtime import safefs
from sandhold.service.locks import KeyedLocks
from sandhold.store.db import SessionRow, Store

T = TypeVar("T")
log = logging.getLogger(__name__)

USE_MARGIN_S = 30  # a use outlives its call's budget by this much before it counts as debris
LOCK_POLL_S = (0.01, 0.2)  # first and longest wait between attempts at a taken session lock
PREPARE = "prepare"  # the tool name a prepare's use and events carry
MAX_HINTS = 100_000  # sessions whose sandbox this replica remembers (_use_warm)


@dataclass
class Lease:
    """A tool call's hold on its session's sandbox (released by ``SandboxSessionManager.use``)."""

    tenant_id: str
    session_id: str
    session_pk: int
    sandbox_id: str
    handle: dict[str, Any]
    policy: TenantPolicy
    # Timeline rows to write when the lease is released, in the transaction that unlocks.
    events: list[dict[str, Any]] = field(default_factory=list)


class SandboxSessionManager(SessionsBase):
    def __init__(
        self, settings: Settings, store: Store, provider: Provider, timeline: Timeline
    ) -> None:
        self.settings = settings
        self.store = store
        self.provider = provider
        self.timeline = timeline
        self.replica = settings.gateway_replica_id or f"{socket.gethostname()}-{os.getpid()}"
        prefix = settings.gateway_tag_prefix
        self.tag_session = prefix + "session_id"
        self.tag_tenant = prefix + "tenant_id"
        self.tag_gateway = prefix + "gateway"
        self.workspace_root = settings.gateway_workspace_root_path
        self._local = KeyedLocks()  # fewer DB round trips when one replica gets a burst
        self._background: set[asyncio.Task[None]] = set()
        self._sandboxes: dict[tuple[str, str], str] = {}  # session -> its sandbox, last seen
        self.handles = HandleSealer(settings)
        self.keep_alive = KeepAlive(settings, store, provider, self.db, self._local)

    async def start(self) -> None:
        # a provider without workspace mounts was refused at start-up (check_gateway_serve)
        self.workspace_root.mkdir(parents=True, exist_ok=True)
        traversable(self.workspace_root)
        await self.provider.start()

    # -- tenants and sessions -------------------------------------------------------------------
    async def policy(self, tenant_id: str) -> TenantPolicy:
        tenant = await self.db(self.store.get_tenant, tenant_id)
        if tenant is None:
            raise NotFound(f"tenant {tenant_id!r} does not exist")
        return TenantPolicy.model_validate(tenant.policy or {})

    async def session(self, tenant_id: str, session_id: str) -> SessionRow:
        check_id(session_id, "session id", SESSION_ID_RE)
        row = await self.db(self.store.get_session, tenant_id, session_id)
        if row is None:
            raise SessionNotFound(f"session {session_id!r} does not exist")
        return row

    @contextlib.asynccontextmanager
    async def locked(self, pk: int) -> AsyncIterator[str]:
        """Hold the session's lease lock (waiting for it at most two lease times)."""
        async with self._local(pk):
            ttl = self.settings.gateway_lock_ttl_s
            token = await self._poll_lock(lambda: self.db(self.store.try_lock, pk, ttl))
            try:
                yield token
            finally:
                await self.db(self.store.unlock, pk, token)

    # -- a tool call's lease --------------------------------------------------------------------
    # A warm call's store work before its answer: open-and-lock, add-use-and-unlock, end-use
    # (with its events); after it, lock, set the keep-alive, unlock. (PostgreSQL: one round
    # trip per statement, in autocommit; see store/db.py.)
    async def _open_locked(self, tenant_id: str, session_id: str) -> tuple[SessionRow, str]:
        """The session's row (created on first use) with its lease lock held."""
        check_id(session_id, "session id", SESSION_ID_RE)
        ttl = self.settings.gateway_lock_ttl_s

        async def attempt() -> tuple[SessionRow, str] | None:
            row, token, created = await self.db(
                self.store.open_and_lock, tenant_id, session_id, ttl
            )
            if created:
                await self.timeline.record(tenant_id, session_id, "session_opened")
            return None if token is None else (row, token)

        return await self._poll_lock(attempt)

    async def _poll_lock(self, attempt: Callable[[], Awaitable[T | None]]) -> T:
        """Retry ``attempt`` (a try at a session's lease lock) with backoff until it returns
        something, for at most two lease times."""
        deadline = time.monotonic() + 2 * self.settings.gateway_lock_ttl_s
        delay = LOCK_POLL_S[0]
        while (got := await attempt()) is None:
            if time.monotonic() > deadline:
                raise SessionBusy("the session is busy (its sandbox is being changed); retry")
            await asyncio.sleep(delay)
            delay = min(delay * 2, LOCK_POLL_S[1])
        return got

    @contextlib.asynccontextmanager
    async def use(
        self,
        tenant_id: str,
        session_id: str,
        tool: str,
        budget_s: float,
        policy: TenantPolicy | None = None,
    ) -> AsyncIterator[Lease]:
        """Make sure the session has a running sandbox and hold it for one tool call."""
        cause = "prepare call" if tool == PREPARE else "tool call"
        policy = policy or await self.policy(tenant_id)
        budget = math.ceil(budget_s) + USE_MARGIN_S
        key = (tenant_id, session_id)
        async with self._local(key):
            warm = await self._use_warm(key, tool, budget, policy)
            if warm is not None:
                row, use_id, handle = warm
                sandbox_id = row.sandbox_id or ""
            else:
                row, token = await self._open_locked(tenant_id, session_id)
                try:
                    if row.state == "closed":
                        raise SessionClosed(f"session {session_id!r} is closed")
                    sandbox_id, handle = await self._ensure(row, token, policy, budget, cause)
                    use_id = await self.db(
                        self.store.add_use_and_unlock,
                        row.pk,
                        token,
                        sandbox_id,
                        self.replica,
                        tool,
                        budget,
                    )
                except BaseException:
                    await self.db(self.store.unlock, row.pk, token)
                    raise
                self._hint(key, sandbox_id)
        lease = Lease(tenant_id, session_id, row.pk, sandbox_id, handle, policy)
        try:
            yield lease
        finally:
            # Before the answer: the call's events are durable and its use is gone. After it
            # (the caller does not wait for the provider): the keep-alive restored.
            await self.db(self.store.end_use, use_id, row.pk, lease.events)
            self.keep_alive.restore_soon((tenant_id, session_id), row.pk, sandbox_id, policy)

    async def _use_warm(
        self, key: tuple[str, str], tool: str, budget: int, policy: TenantPolicy
    ) -> tuple[SessionRow, str, dict[str, Any]] | None:
        """The warm path: the session's sandbox, as this replica last saw it, runs past the
        call's budget by the provider's own account (``known_running_for``), so the call needs
        no provider call and no lock held across one: its use is registered in one statement
        that checks the lock free and the sandbox still the session's (``Store.use_if_free``).
        None: take the lock (no hint, a sandbox to resume, a lock held, a network change)."""
        sandbox_id = self._sandboxes.get(key)
        if sandbox_id is None or self.provider.known_running_for(sandbox_id) < budget:
            return None
        got = await self.db(
            self.store.use_if_free, key[0], key[1], sandbox_id, self.replica, tool, budget
        )
        if got is None:
            return None
        row, use_id = got
        handle = self._opened(row)
        if handle.get("network", EgressPolicy().model_dump()) != policy.network.model_dump():
            await self.db(self.store.end_use, use_id, row.pk)  # changed under the lock instead
            return None
        return row, use_id, handle

    def _hint(self, key: tuple[str, str], sandbox_id: str) -> None:
        """Remember the session's sandbox for ``_use_warm`` (a hint: the store decides)."""
        self._sandboxes.pop(key, None)
        self._sandboxes[key] = sandbox_id
        while len(self._sandboxes) > MAX_HINTS:
            del self._sandboxes[next(iter(self._sandboxes))]

    async def _ensure(
        self, row: SessionRow, token: str, policy: TenantPolicy, budget: int, cause: str
    ) -> tuple[str, dict[str, Any]]:
        """The session's sandbox, running for this use: its own while it lives (resumed if it
        paused), else a new one."""
        if row.sandbox_id:
            kept = await self._reuse(row, token, policy, budget, cause)
            if kept is not None:
                return kept
        return await self._create(row, token, policy, policy.keep_alive_s + budget, cause)

    async def _reuse(
        self, row: SessionRow, token: str, policy: TenantPolicy, budget: int, cause: str
    ) -> tuple[str, dict[str, Any]] | None:
        """The session's sandbox connected (resumed if paused, its egress brought up to the
        policy); None when it is gone, failed or must be replaced (then dropped from the row)."""
        sandbox_id = row.sandbox_id or ""
        # Running for sure (the provider set its end itself): no read before connect, and no
        # connect when it runs past the use's end anyway (no other call's end shortens it
        # below a live use's: see keep_alive.py).
        left = self.provider.known_running_for(sandbox_id)
        known = left > 0
        before = None if known else await self.provider.get(sandbox_id)
        if not known and before is None:
            await self._drop_gone(row, token, None)
            return None
        try:
            t0 = time.monotonic()
            resumed, fresh = False, dict[str, Any]()
            if left < budget:
                timeout = policy.keep_alive_s + budget
                resumed, fresh = await self.provider.connect(sandbox_id, timeout)
            if resumed or (before is not None and before.state != "running"):
                await self._record_resume(row, before, t0, cause)
            handle = {**self._opened(row), **fresh}
            return sandbox_id, await self._apply_network(row, token, policy, handle)
        except SandboxGone:
            if known:  # what it is now: failed (kept until killed) or gone
                before = await self.provider.get(sandbox_id)
            if before is not None and before.failure is not None:
                await self.record_stop(row, before)
        except NeedsNewSandbox as e:
            await self.provider.kill(sandbox_id)
            await self.timeline.record(
                row.tenant_id,
                row.session_id,
                "sandbox_replaced",
                sandbox_id=sandbox_id,
                reason=f"the tenant's network policy changed: {e.message}",
            )
            if not await self.db(self.store.set_sandbox, row.pk, token, None, None):
                raise SessionBusy("lost the session lock; retry") from None
            return None
        await self._drop_gone(row, token, before)
        return None

    async def _record_resume(
        self, row: SessionRow, before: ProviderSandbox | None, t0: float, cause: str
    ) -> None:
        if before is not None:  # else paused by someone else: when, unknown
            await self.record_stop(row, before)
        await self.timeline.record(
            row.tenant_id,
            row.session_id,
            "sandbox_resumed",
            sandbox_id=row.sandbox_id,
            duration_ms=ms_since(t0),
            reason=f"{cause} on a paused sandbox",
            provider_state=before.public() if before else None,
        )

    async def _drop_gone(self, row: SessionRow, token: str, before: ProviderSandbox | None) -> None:
        """The session's sandbox is gone or failed: recorded, a failed one killed, and the
        session left without one."""
        failed = before is not None and before.failure is not None
        gone = "failed" if failed else "no longer exists at the provider"
        if failed:
            # Killed now, not by the reclaimer later: it never runs again, and it holds the
            # workspace (one with a disk budget is attached to one sandbox at a time).
            with contextlib.suppress(ProviderError):
                if await self.provider.kill(row.sandbox_id or ""):
                    gone += " (killed it)"
        await self.timeline.record(
            row.tenant_id,
            row.session_id,
            "failure",
            sandbox_id=row.sandbox_id,
            reason=f"the session's sandbox {gone}; creating anew",
        )
        if not await self.db(self.store.set_sandbox, row.pk, token, None, None):
            raise SessionBusy("lost the session lock; retry")

    async def _apply_network(
        self, row: SessionRow, token: str, policy: TenantPolicy, handle: dict[str, Any]
    ) -> dict[str, Any]:
        """Bring a live sandbox's egress rules up to the tenant's policy (the handle remembers
        what the sandbox has; sessions from before egress policies had none)."""
        wanted = policy.network.model_dump()
        if handle.get("network", EgressPolicy().model_dump()) == wanted:
            return handle
        t0 = time.monotonic()
        await self.provider.update_network(row.sandbox_id or "", row.tenant_id, policy.network)
        handle = {**handle, "network": wanted}
        if not await self.db(self.store.set_handle, row.pk, token, self._sealed(row, handle)):
            raise SessionBusy("lost the session lock; retry")
        await self.timeline.record(
            row.tenant_id,
            row.session_id,
            "sandbox_network_updated",
            sandbox_id=row.sandbox_id,
            duration_ms=ms_since(t0),
            reason=f"the tenant's network policy is now {wanted}",
        )
        return handle

    async def record_stop(self, row: SessionRow, sbx: ProviderSandbox) -> bool:
        """Record, once per stop (its endAt) by whichever replica sees it first, that the
        session's sandbox paused, or failed (a failed one is also listed as paused)."""
        if sbx.state != "paused" or sbx.end_at is None:
            return False
        if not await self.db(self.store.record_pause_once, row.pk, sbx.id, sbx.end_at):
            return False
        kind, reason = stop_event(sbx.failure)
        await self.timeline.record(
            row.tenant_id,
            row.session_id,
            kind,
            at=sbx.end_at,
            sandbox_id=sbx.id,
            reason=reason,
            provider_state=sbx.public(),
        )
        return True

    # -- prepare ----------------------------------------------------------------------------------
    async def prepare(self, tenant_id: str, session_id: str) -> dict[str, Any]:
        """Make the session's sandbox ready now (create or resume it, like a tool call that runs
        nothing), so that the first tool call does not wait for it; then the keep-alive runs."""
        async with self.use(tenant_id, session_id, PREPARE, 0):
            pass
        return await self.status(tenant_id, session_id)

    def prepare_in_background(self, tenant_id: str, session_id: str) -> None:
        """``prepare`` without waiting; a failure is logged and recorded in the timeline."""
        check_id(session_id, "session id", SESSION_ID_RE)

        async def run() -> None:
            try:
                await self.prepare(tenant_id, session_id)
            except Exception as e:
                log.warning("prepare of session %s failed: %s", session_id, e)
                error = f"{e.code}: {e.message}" if isinstance(e, SandholdError) else repr(e)
                await self.timeline.record(
                    tenant_id,
                    session_id,
                    "failure",
                    tool=PREPARE,
                    error=error,
                    reason="prepare failed",
                )

        task = asyncio.create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def stop(self) -> None:
        """Cancel background prepares (a half-done one is finished by the next call); let the
        keep-alives being restored finish (each is two store writes and a provider call)."""
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.keep_alive.stop()

    # -- status and close -----------------------------------------------------------------------
    async def status(self, tenant_id: str, session_id: str) -> dict[str, Any]:
        """The session as the store and the provider see it; never resumes the sandbox."""
        row = await self.session(tenant_id, session_id)
        sandbox = await self.provider.get(row.sandbox_id) if row.sandbox_id else None
        return {
            "session_id": row.session_id,
            "tenant_id": row.tenant_id,
            "state": row.state,
            "created_at": row.created_at,
            "closed_at": row.closed_at,
            "sandbox": sandbox.public() if sandbox else None,
            "workspace": "/workspace",
            "provider": self.provider.name,
            "capabilities": self.provider.capabilities.public(),
        }

    async def close(self, tenant_id: str, session_id: str) -> dict[str, Any]:
        """Kill the session's sandbox and close the session (its workspace kept or deleted per
        the tenant's policy). A tool call still running on the sandbox is cut off: closing is
        the platform's explicit decision."""
        policy = await self.policy(tenant_id)
        row = await self.session(tenant_id, session_id)
        async with self.locked(row.pk) as token:
            fresh = await self.db(self.store.session_by_pk, row.pk)
            assert fresh is not None
            row = fresh
            if row.state == "closed":
                raise SessionClosed(f"session {session_id!r} is already closed")
            killed = None
            if row.sandbox_id:
                killed = row.sandbox_id if await self.provider.kill(row.sandbox_id) else None
            if not await self.db(self.store.mark_closed, row.pk, token):
                raise SessionBusy("lost the session lock; retry")
        deleted = policy.workspace_on_close == "delete"
        if deleted:
            await self.db(safefs.remove_quietly, self.workspace_dir(tenant_id, session_id))
        await self.timeline.record(
            tenant_id,
            session_id,
            "session_closed",
            sandbox_id=killed,
            reason=f"closed by the platform; workspace {'deleted' if deleted else 'kept'}",
        )
        return {
            "session_id": session_id,
            "closed": True,
            "sandbox_killed": killed,
            "workspace_deleted": deleted,
        }
