"""Restoring a session's keep-alive after a tool call: idle time counts from the end of the
session's last call. The keep-alive is set ``KEEP_ALIVE_SLACK`` longer (of itself, in whole
seconds: 9 s of 15 min, none under 100 s), so calls in a row make no provider write each; a
sandbox pauses between the keep-alive and the keep-alive plus the slack after its last call,
never sooner."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sandhold.config import Settings
from sandhold.gateway.policy import TenantPolicy
from sandhold.gateway.providers.base import Provider
from sandhold.service.locks import KeyedLocks
from sandhold.store.db import Store

T = TypeVar("T")
log = logging.getLogger(__name__)

KEEP_ALIVE_SLACK = 0.01


def with_slack(keep_alive_s: int) -> int:
    return keep_alive_s + int(keep_alive_s * KEEP_ALIVE_SLACK)


class KeepAlive:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        provider: Provider,
        db: Callable[..., Awaitable[Any]],
        local: KeyedLocks,
    ) -> None:
        self.settings = settings
        self.store = store
        self.provider = provider
        self.db = db  # a store call off the event loop
        self.local = local  # the manager's per-session locks
        self.pending: set[asyncio.Task[None]] = set()  # keep-alives being restored

    def restore_soon(
        self, key: tuple[str, str], pk: int, sandbox_id: str, policy: TenantPolicy
    ) -> None:
        """``restore`` in the background, holding the session's local lock: this replica's
        next call on the session waits for it in memory rather than polling the store's lock.
        Nothing to do when the sandbox surely ends between a keep-alive and a keep-alive plus
        the slack from now: every live use ends before that (each call saw to it that the
        sandbox runs past its use's end), and a call that extended it for its own run leaves
        it longer than that."""
        keep = policy.keep_alive_s
        if keep <= self.provider.known_running_for(sandbox_id) <= with_slack(keep):
            return

        async def run() -> None:
            async with self.local(key):
                try:
                    await self.restore(pk, sandbox_id, policy)
                except Exception:
                    log.exception("could not restore the keep-alive of session %s", pk)

        task = asyncio.create_task(run())
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def restore(self, pk: int, sandbox_id: str, policy: TenantPolicy) -> None:
        """A call is over: idle time counts from now. Under the lock, so that no other call's
        connect (which extends the timeout for its own run) slips between reading the uses and
        setting the timeout. If the lock is taken, the holder sets the timeout after us:
        leaving the longer one is the safe side."""
        ttl = self.settings.gateway_lock_ttl_s
        token, live = await self.db(self.store.lock_for_keep_alive, pk, ttl)
        if token is None:
            return
        try:
            remaining = [math.ceil(t - time.time()) for t in live]
            keep = with_slack(policy.keep_alive_s)
            await self.provider.set_timeout(sandbox_id, max([keep, *remaining]))
        finally:
            await self.db(self.store.unlock, pk, token)

    async def stop(self) -> None:
        """Let the keep-alives being restored finish (each is two store writes and a call)."""
        await asyncio.gather(*self.pending, return_exceptions=True)
