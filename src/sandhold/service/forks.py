"""Fork through the service: each fork is a sandbox of the source's owner with a lifecycle of
its own (new envd and traffic tokens, its own end time), restored from one checkpoint of the
source (runtime/checkpoint/fork.py). The source keeps its id, record and end time."""

from __future__ import annotations

import secrets
import time
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from sandhold.errors import InvalidRequest, SandholdError
from sandhold.runtime.checkpoint.fork import MAX_FORKS
from sandhold.runtime.records import SandboxInfo
from sandhold.runtime.runtime import Runtime
from sandhold.service.offload import Offload
from sandhold.service.records import RECORD_KEY, Lifecycle, Sandbox

DEFAULT_TIMEOUT_S = 300  # E2B's API default


class ServiceParts(Protocol):
    """What a fork uses of the service (``SandboxService`` has it all)."""

    runtime: Runtime
    offload: Offload

    def check_timeout(self, timeout: int) -> None: ...

    def lock(self, sandbox_id: str) -> AbstractAsyncContextManager[None]: ...

    async def usable(self, owner: str, sandbox_id: str) -> Sandbox: ...


async def fork(
    service: ServiceParts, owner: str, sandbox_id: str, timeout: int | None, count: int | None
) -> list[Sandbox | SandholdError]:
    timeout = DEFAULT_TIMEOUT_S if timeout is None else timeout
    service.check_timeout(timeout)
    count = 1 if count is None else count
    if not 1 <= count <= MAX_FORKS:
        raise InvalidRequest(f"count must be between 1 and {MAX_FORKS}")
    async with service.lock(sandbox_id):
        src = await service.usable(owner, sandbox_id)
        now = time.time()
        lives = [_lifecycle(src.life, timeout, now) for _ in range(count)]
        got = await service.offload.run(
            service.runtime.fork, src.id, [{RECORD_KEY: life.model_dump()} for life in lives]
        )
    return [_result(r, life) for r, life in zip(got, lives, strict=True)]


def _lifecycle(src: Lifecycle, timeout: int, now: float) -> Lifecycle:
    """The source's lifecycle settings with tokens and an end time of the fork's own."""
    traffic = None if src.traffic_token is None else secrets.token_urlsafe(32)
    return src.model_copy(
        update={
            "access_token": secrets.token_urlsafe(32),
            "traffic_token": traffic,
            "timeout": timeout,
            "end_at": now + timeout,
            "idempotency_key": None,
            "idempotency_hash": None,
        }
    )


def _result(got: SandboxInfo | SandholdError, life: Lifecycle) -> Sandbox | SandholdError:
    return Sandbox(got, life) if isinstance(got, SandboxInfo) else got
