"""``sandhold worker``: the ``anthropic`` SDK's environment worker with its tools in Sandhold.

The per-item flow is the SDK's public ``EnvironmentWorker.handle_item``
(``anthropic.lib.environments``): it claims the item with a first heartbeat, heartbeats its
lease while the session is served, runs the SDK's ``SessionToolRunner`` over the session's event
stream (reconciling with the event list after every reconnect, so a tool use left unanswered by a
worker that died is answered by the next one), answers ``agent.tool_use`` with
``user.tool_result`` and ``agent.custom_tool_use`` with ``user.custom_tool_result``, drops an
item whose heartbeat gets 412 (lease lost) without stopping it, and force-stops an item it has
finished. The items come from the SDK's public poller (``aiter_work``, which acks each one).
What Sandhold adds is the tools: a factory gives the SDK the toolset of ``tools.py`` bound to the
item's session, whose sandbox is the gateway's session of the same id (re-attached by any
worker); and, around the SDK's flow, the sandbox is prepared as soon as an item is claimed, and
SIGTERM releases the current item: its running tool call finishes and its result is posted
(``InFlight``; the SDK itself would cancel the call), then the item's stop is not sent
(``WorkerTransport``), so its lease lapses and another worker takes the item over.

Only public names of the SDK (pinned ``anthropic==2.17.0``): ``EnvironmentWorker``,
``handle_item``, ``aiter_work``, the client's ``http_client`` (``DefaultAsyncHttpxClient``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shutil
import signal
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx2
from anthropic import AsyncAnthropic, DefaultAsyncHttpxClient
from anthropic.lib.environments import BetaAnyRunnableTool, EnvironmentWorker, aiter_work

from sandhold.worker.gateway import Gateway
from sandhold.worker.tools import InFlight, SandboxTools, unhandled_custom_tools

if TYPE_CHECKING:
    from anthropic.lib.tools.agent_toolset import AgentToolContext
    from anthropic.types.beta.environments import BetaSelfHostedWork

    from sandhold.config import Settings

log = logging.getLogger("sandhold.worker")
STOP_PATH = re.compile(r"^/v1/environments/[^/]+/work/([^/]+)/stop$")
EVENTS_PATH = re.compile(r"^/v1/sessions/[^/]+/events$")  # (where tool results are posted)
SETTLE_MAX_S = 150.0  # a release waits this long at most for calls in flight: the SDK's bound


class WorkerTransport(httpx2.AsyncBaseTransport):
    """The worker's HTTP transport. Every request goes on, but the stop of an item being
    released, which is answered as the API answers the stop of an item already stopped (409,
    which the SDK takes as done): the SDK force-stops an item whenever its handling ends with
    its lease held, and a released item must not be stopped, so that the control plane gives it
    to another worker once its lease lapses. It also sees each tool result posted
    (``InFlight``: a release waits for them)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, in_flight: InFlight) -> None:
        self.inner = inner
        self.in_flight = in_flight
        self.released: set[str] = set()  # work ids

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        m = STOP_PATH.match(request.url.path)
        if request.method == "POST" and m is not None and m.group(1) in self.released:
            log.info("work %s released: not stopped", m.group(1))
            body = {"type": "error", "error": {"type": "conflict_error", "message": "released"}}
            no_retry = {"x-should-retry": "false"}  # (the SDK retries a 409 otherwise)
            return httpx2.Response(409, json=body, headers=no_retry, request=request)
        response = await self.inner.handle_async_request(request)
        posted = request.method == "POST" and response.status_code < 300
        if posted and EVENTS_PATH.match(request.url.path):
            self.in_flight.posted()
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class SandboxWorker(EnvironmentWorker):
    """One environment's worker whose tools run in the Sandhold sandbox of each session."""

    def __init__(
        self,
        client: AsyncAnthropic,
        transport: WorkerTransport,
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
            max_concurrent_calls=settings.worker_max_concurrent_calls,
            # Memory stores would be synced to this host's disk, not the sandbox: off.
            memory_sync_interval=None,
            worker_id=settings.worker_id,
        )
        self.client = client
        self.transport = transport
        self.gateway = gateway
        self.settings = settings
        self.environment_id = environment_id
        self.work_id: str | None = None  # the current item's, while one is served
        self.session_id: str | None = None  # and its session's id

    def tools_for(self, ctx: AgentToolContext) -> Sequence[BetaAnyRunnableTool]:
        """The SDK's factory hook, called once per claimed session with its context."""
        session = ctx.session
        assert session is not None  # the SDK's worker always passes the fetched session
        s = self.settings
        # The sandbox is the work item's session's (serve_item checked that its body names it).
        session_id = self.session_id or session.id
        tools = SandboxTools(
            self.gateway,
            session_id,
            max_file_bytes=s.worker_max_file_bytes,
            bash_timeout_s=s.worker_bash_timeout_s,
            in_flight=self.transport.in_flight,
        ).toolset()
        if s.worker_custom_tools == "error":
            builtin = {t.name for t in tools}
            custom = [t.name for t in session.agent.tools if t.type == "custom"]
            tools += unhandled_custom_tools([n for n in custom if n not in builtin])
        return tools

    async def run(self) -> None:
        """Poll the environment (the SDK's poller) and serve each item, until cancelled."""
        items = aiter_work(
            self.client.beta.environments.work,
            environment_id=self.environment_id,
            worker_id=self.settings.worker_id,
            auto_stop=False,  # (handle_item stops what it served)
        )
        async with contextlib.aclosing(items):
            async for item in items:
                try:
                    await self.serve_item(item)
                except Exception as e:
                    log.error("work %s failed", item.id, exc_info=e)

    async def serve_item(self, item: BetaSelfHostedWork) -> None:
        self.work_id = item.id
        self.session_id = item.data.id if item.data.type == "session" else None
        try:
            if self.session_id is None:
                log.info("work %s is not a session's: stopped", item.id)
                await self._stop(item)
                return
            log.info("work %s: session %s", item.id, self.session_id)
            if not await self._session_is_the_items(item):
                return
            await self.gateway.prepare(self.session_id)
            await self.handle_item(
                work_id=item.id,
                environment_id=item.environment_id,
                session_id=self.session_id,
                work_secret=item.secret,
            )
        finally:
            self.work_id = None
            self.session_id = None

    async def _session_is_the_items(self, item: BetaSelfHostedWork) -> bool:
        """Whether the control plane's session body names the item's session: the SDK serves
        the events of the session its body names, and the tools run in the item's session's
        sandbox, so a body naming another session would run that session's calls in this one's
        sandbox (a control plane's bug; refused: the item is stopped)."""
        session = await self.client.beta.sessions.retrieve(str(self.session_id))
        if session.id == self.session_id:
            return True
        log.error(
            "work %s: the control plane's body of session %s names %r: refused (stopped)",
            item.id,
            self.session_id,
            session.id,
        )
        await self._stop(item)
        return False

    async def _stop(self, item: BetaSelfHostedWork) -> None:
        await self.client.beta.environments.work.stop(
            item.id, environment_id=item.environment_id, force=True
        )

    def release(self) -> None:
        """Give the current item back, if one is served: the caller then waits
        for the calls in flight and their results, and cancels the serving task; the item is not
        stopped (``WorkerTransport``), so its lease lapses and the control plane hands it to
        another worker, which continues the session in the same sandbox."""
        if self.work_id is not None:
            log.info("releasing the current work item (SIGTERM)")
            self.transport.released.add(self.work_id)


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
    transport = WorkerTransport(httpx2.AsyncHTTPTransport(), InFlight())
    client = AsyncAnthropic(
        base_url=control["worker_base_url"],
        auth_token=control["worker_environment_key"],
        http_client=DefaultAsyncHttpxClient(transport=transport),  # (the SDK's defaults)
    )
    worker = SandboxWorker(
        client,
        transport,
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
            # The call in flight finishes and its result is posted before the item is let go
            # (the SDK would cancel it: an interrupted call's result is an error).
            if not await transport.in_flight.settled(SETTLE_MAX_S):
                log.warning("released with a tool call still running")
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
