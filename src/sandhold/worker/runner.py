"""``sandhold worker``: the ``anthropic`` SDK's environment worker with its tools in Sandhold.

The work loop is the SDK's ``EnvironmentWorker`` (``anthropic.lib.environments``): it polls the
environment's queue, acks each item, heartbeats its lease while the session is served, runs the
SDK's ``SessionToolRunner`` over the session's event stream (reconciling with the event list
after every reconnect, so a tool use left unanswered by a worker that died is answered by the
next one), answers ``agent.tool_use`` with ``user.tool_result`` and ``agent.custom_tool_use``
with ``user.custom_tool_result``, drops an item whose heartbeat gets 412 (lease lost) without
stopping it, and stops an item it has finished. What Sandhold adds is the tools: a factory
gives the SDK the toolset of ``tools.py`` bound to the item's session, whose sandbox is the
gateway's session of the same id (re-attached by any worker), and this subclass adds two
things the SDK does not have: the sandbox is prepared as soon as an item is claimed, and
SIGTERM releases the current item (its running tool call finishes and posts its result, the
lease is left to lapse so another worker takes the item over) instead of cancelling it.

The SDK's private hooks used, pinned with ``anthropic==2.15.0``: ``EnvironmentWorker._handle_item``
(overridden, to know the current item's lease) and ``_Lease.finish(LEASE_LOST)`` (to release it).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import signal
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from anthropic import AsyncAnthropic
from anthropic.lib.environments import BetaAnyRunnableTool, EnvironmentWorker
from anthropic.lib.environments._worker import _Lease, _LeaseEndReason

from sandhold.worker.gateway import Gateway
from sandhold.worker.tools import SandboxTools, unhandled_custom_tools

if TYPE_CHECKING:
    from anthropic.lib.tools.agent_toolset import AgentToolContext
    from anthropic.types.beta.environments import BetaSelfHostedWork

    from sandhold.config import Settings

log = logging.getLogger("sandhold.worker")


class SandboxWorker(EnvironmentWorker):
    """One environment's worker whose tools run in the Sandhold sandbox of each session."""

    def __init__(
        self,
        client: AsyncAnthropic,
        gateway: Gateway,
        settings: Settings,
        *,
        environment_id: str,
        environment_key: str,
        workdir: Path,
    ) -> None:
        super().__init__(
            client,
            environment_id=environment_id,
            environment_key=environment_key,
            tools=self.tools_for,
            # The SDK downloads the agent's skills under workdir on this host (a private temp
            # directory); the tools never read it: the session's files are in its sandbox.
            workdir=workdir,
            max_idle=settings.worker_max_idle_s,
            # Memory stores would be synced to this host's disk, not the sandbox: off.
            memory_sync_interval=None,
            worker_id=settings.worker_id,
        )
        self.gateway = gateway
        self.settings = settings
        self.lease: _Lease | None = None  # the current item's, while one is served
        self.session_id: str | None = None  # and its session's id
        self.draining = False
        self.idle = asyncio.Event()  # set while no item is served
        self.idle.set()

    def tools_for(self, ctx: AgentToolContext) -> Sequence[BetaAnyRunnableTool]:
        """The SDK's factory hook, called once per claimed session with its context."""
        session = ctx.session
        assert session is not None  # the SDK's worker always passes the fetched session
        s = self.settings
        # The sandbox is the work item's session's, whose events the SDK's runner serves: not
        # the id in the fetched session's body, which a control plane could get wrong.
        session_id = self.session_id or session.id
        if session.id != session_id:
            log.warning(
                "session %s: the control plane's session body says %r; its tools run "
                "in the work item's session",
                session_id,
                session.id,
            )
        tools = SandboxTools(
            self.gateway,
            session_id,
            max_file_bytes=s.worker_max_file_bytes,
            bash_timeout_s=s.worker_bash_timeout_s,
        ).toolset()
        if s.worker_custom_tools == "error":
            builtin = {t.name for t in tools}
            custom = [t.name for t in session.agent.tools if t.type == "custom"]
            tools += unhandled_custom_tools([n for n in custom if n not in builtin])
        return tools

    async def _handle_item(
        self,
        work_item: BetaSelfHostedWork,
        environment_key: str | None,
        lease: _Lease | None = None,
    ) -> None:
        lease = lease or _Lease()
        self.lease = lease
        self.session_id = work_item.data.id if work_item.data.type == "session" else None
        self.idle.clear()
        try:
            if work_item.data.type == "session" and not self.draining:
                log.info("work %s: session %s", work_item.id, work_item.data.id)
                await self.gateway.prepare(work_item.data.id)
            if not self.draining:
                await super()._handle_item(work_item, environment_key, lease)
        finally:
            self.lease = None
            self.session_id = None
            self.idle.set()
        if self.draining:
            # Never poll again: the serving task is cancelled once it is here.
            await asyncio.Event().wait()

    def release(self) -> None:
        """Give the current item back: the SDK's runner stops (a tool call in flight finishes
        and posts its result first: the SDK shields it), and the item is neither stopped nor
        heartbeated again, so its lease lapses and the control plane hands it to another
        worker, which continues the session in the same sandbox."""
        self.draining = True
        if self.lease is not None and not self.lease.ended:
            log.info("releasing the current work item (SIGTERM)")
            self.lease.finish(_LeaseEndReason.LEASE_LOST)


async def serve(settings: Settings) -> int:
    """Serve the environment until SIGTERM or SIGINT; returns the exit status."""
    control = settings.check_worker()
    assert settings.worker_gateway_key is not None  # check_worker refused it otherwise
    gateway = Gateway(
        settings.worker_gateway_url, settings.worker_gateway_key, settings.worker_gateway_timeout_s
    )
    workdir = Path(tempfile.mkdtemp(prefix="sandhold-worker-"))
    # The SDK's worker authenticates every call with the environment key (or the item's
    # sessions token), through its own scoped copies of this client.
    client = AsyncAnthropic(
        base_url=control["worker_base_url"], auth_token=control["worker_environment_key"]
    )
    worker = SandboxWorker(
        client,
        gateway,
        settings,
        workdir=workdir,
        environment_id=str(control["worker_environment_id"]),
        environment_key=str(control["worker_environment_key"]),
    )
    for noisy in ("httpx", "httpx2"):  # a line per request, heartbeats included
        logging.getLogger(noisy).setLevel(logging.WARNING)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    task = asyncio.create_task(worker.run(), name="environment-worker")
    log.info(
        "serving environment %s with gateway %s",
        control["worker_environment_id"],
        settings.worker_gateway_url,
    )
    status = 0
    try:
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if task.done():
            status = _failed(task)
        else:
            worker.release()
            await worker.idle.wait()  # the item in hand, if any, has been released
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            log.info("stopped")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await gateway.aclose()
        await client.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return status


def _failed(task: asyncio.Task[Any]) -> int:
    """The worker loop ended on its own: only a permanent error does (a refused key, say)."""
    error = task.exception()
    log.error("the worker loop ended: %s", error)
    return 1 if error is not None else 0
