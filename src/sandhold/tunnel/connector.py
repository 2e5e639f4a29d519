"""``sandhold tunnel connect``: the connector inside the private network.

It dials out only: long-polls the gateway for MCP requests of its tunnel
(``GET /v1/tunnels/{id}/poll``), relays each to the internal MCP server of its channel
(``upstreams.py``), and posts the answer (``POST /v1/tunnels/{id}/response`` with the command's
``X-Tunnel-Shard-Token``). A failed poll is retried with exponential backoff and full jitter; a
response is retried on network errors, 408, 429, 502, 503 and 504 until the command's deadline
(``response_timeout``, from the poll's receipt); a command past its deadline is dropped without
an answer, as tunnel-client's protocol says. A 429 or 503 with ``Retry-After`` (seconds or an
HTTP date, capped at ``backoff_max_s``) is retried after that long; a 404 to a response is
terminal (the gateway holds no such request): never sent again. A command for a channel this
connector does not serve is answered ``unsupported_channel``.

A local HTTP listener serves ``/healthz`` (the process runs), ``/readyz`` (the gateway holds or
answered the last poll, and every upstream is reachable) and ``/metrics`` (Prometheus text).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import logging
import random
import re
import signal
import time
import uuid
from collections.abc import Generator
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sandhold.tunnel.connector_config import ConnectorConfig, resolve
from sandhold.tunnel.upstreams import HttpUpstream, StdioUpstream, failure, make_upstream

log = logging.getLogger(__name__)

CLIENT_NAME = "sandhold-tunnel-connector"
CLIENT_VERSION = "0.1.0"
RETRY_STATUS = {408, 429, 502, 503, 504}
TIMEOUT_RE = re.compile(r"^(\d+)(ns|us|ms|s|m|h)$")
UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
HELD_S = 0.5  # a poll the gateway holds this long without an error: connected


def retry_after(r: httpx.Response, cap: float) -> float | None:
    """A 429's or 503's ``Retry-After`` in seconds (delta-seconds or an HTTP date), at most
    ``cap``; None without a usable one."""
    raw = r.headers.get("retry-after") if r.status_code in (429, 503) else None
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(raw).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return min(max(seconds, 0.0), cap)


def response_timeout(raw: object) -> float | None:
    """tunnel-client's ``response_timeout`` (``30s``, ``4500ms``) in seconds; None when absent or
    malformed (no deadline, as the protocol says readers fail open)."""
    m = TIMEOUT_RE.match(raw) if isinstance(raw, str) else None
    return int(m.group(1)) * UNITS[m.group(2)] if m else None


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.polls = Counter(
            "sandhold_tunnel_polls", "Polls of the gateway by outcome", ["outcome"], registry=r
        )
        self.commands = Counter(
            "sandhold_tunnel_commands",
            "Commands relayed, by channel and outcome",
            ["channel", "outcome"],
            registry=r,
        )
        self.seconds = Histogram(
            "sandhold_tunnel_command_seconds", "Time from poll to answer", ["channel"], registry=r
        )
        self.up = Gauge(
            "sandhold_tunnel_upstream_up",
            "1 if the channel's server is reachable",
            ["channel"],
            registry=r,
        )
        self.connected = Gauge(
            "sandhold_tunnel_connected", "1 if the last poll succeeded", registry=r
        )


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # the connector handles SIGTERM/SIGINT itself (and stops this server)


class Connector:
    def __init__(self, cfg: ConnectorConfig) -> None:
        self.cfg = cfg
        g = cfg.gateway
        self.token = resolve(g.token, "gateway.token")
        self.instance = f"sh-{uuid.uuid4().hex[:16]}"
        lim = cfg.limits
        self.upstreams: dict[str, HttpUpstream | StdioUpstream] = {
            u.channel: make_upstream(u, lim.max_response_bytes, lim.request_timeout_s)
            for u in cfg.upstream
        }
        self.metrics = Metrics()
        self.last_poll_ok = False
        self.last_error = "not polled yet"
        self.stop = asyncio.Event()
        self.finished = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        # what is relayed at once, however many commands one poll brings
        self.slots = asyncio.Semaphore(g.max_concurrency)
        self.health_url: str | None = None

    def _client(self, timeout: float) -> httpx.AsyncClient:
        g = self.cfg.gateway
        transport = httpx.AsyncHTTPTransport(uds=g.unix_socket, verify=g.ca_file or True)
        channels = [
            {"name": c, **({"proc_affinity": True} if isinstance(u, StdioUpstream) else {})}
            for c, u in sorted(self.upstreams.items())
        ]
        info = json.dumps({"version": 1, "channels": channels}, separators=(",", ":"))
        headers = {
            "Authorization": f"Bearer {self.token}",
            "X-Tunnel-Client-Name": CLIENT_NAME,
            "X-Tunnel-Client-Version": CLIENT_VERSION,
            "X-Tunnel-Client-Instance-Id": self.instance,
            "X-Tunnel-MCP-Server-Info": info,
        }
        return httpx.AsyncClient(
            base_url=g.url.rstrip("/"),
            transport=transport,
            headers=headers,
            timeout=timeout,
            trust_env=False,
        )

    # -- running -------------------------------------------------------------------------------
    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        for channel, up in self.upstreams.items():
            try:
                await up.start()
            except Exception as e:
                up.reachable = False
                log.error("upstream %s did not start: %s", channel, e)
        health = await self._start_health()
        g = self.cfg.gateway
        poll_http = self._client(g.poll_timeout_ms / 1000 + 15)
        self.http = self._client(self.cfg.limits.request_timeout_s)
        try:
            await self._poll_loop(poll_http)
        finally:
            for task in list(self.tasks):
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            await poll_http.aclose()
            await self.http.aclose()
            for up in self.upstreams.values():
                with contextlib.suppress(Exception):
                    await up.close()
            if health is not None:
                health[0].should_exit = True
                await health[1]

    async def _poll_loop(self, http: httpx.AsyncClient) -> None:
        g = self.cfg.gateway
        backoff = g.backoff_initial_s
        path = f"/v1/tunnels/{g.tunnel_id}/poll"
        while not self.stop.is_set():
            while len(self.tasks) >= g.max_concurrency:  # poll only with room for what comes
                self.finished.clear()
                if await self._until_stopped(self.finished.wait()) is None:
                    return
            free = min(g.max_concurrency - len(self.tasks), 25)
            wait, exact = None, False
            try:
                poll = asyncio.ensure_future(
                    http.get(path, params={"limit": free, "timeout_ms": g.poll_timeout_ms})
                )
                held = asyncio.get_running_loop().call_later(HELD_S, self._held, poll)
                try:
                    r = await self._until_stopped(poll)
                finally:
                    held.cancel()
                if r is None:
                    return
                received = time.monotonic()
                if r.status_code in (200, 204):
                    self._polled(True, "")
                    backoff = g.backoff_initial_s
                    # (more than asked for: every one is run all the same, as the protocol says,
                    # max_concurrency of them at a time)
                    for cmd in r.json().get("commands", []) if r.status_code == 200 else []:
                        self._spawn(cmd, received)
                else:
                    self._polled(False, _explain(r))
                    hint = retry_after(r, g.backoff_max_s)
                    wait, exact = (backoff, False) if hint is None else (hint, True)
            except (httpx.HTTPError, ValueError) as e:
                self._polled(False, f"cannot reach the gateway: {type(e).__name__}: {e}")
                wait = backoff
            if wait is not None:
                log.warning("poll failed (%s); again in up to %.1f s", self.last_error, wait)
                with contextlib.suppress(TimeoutError):
                    pause = wait if exact else random.uniform(0, wait)
                    await asyncio.wait_for(self.stop.wait(), pause)
                backoff = min(backoff * 2, g.backoff_max_s)

    async def _until_stopped(self, coro: Any) -> Any:
        task = asyncio.ensure_future(coro)
        stopper = asyncio.ensure_future(self.stop.wait())
        done, _ = await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if task not in done:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            return None
        stopper.cancel()
        return task.result()

    def _held(self, poll: asyncio.Future[httpx.Response]) -> None:
        """The gateway holds the poll: connected, ready, before its answer comes."""
        if not poll.done():
            self.last_poll_ok, self.last_error = True, ""
            self.metrics.connected.set(1)

    def _polled(self, ok: bool, error: str) -> None:
        self.last_poll_ok, self.last_error = ok, error
        self.metrics.polls.labels("ok" if ok else "error").inc()
        self.metrics.connected.set(1 if ok else 0)

    def _spawn(self, cmd: dict[str, Any], received: float) -> None:
        async def run() -> None:
            try:
                await self._process(cmd, received)
            except Exception:
                log.exception("command %s failed", cmd.get("request_id"))

        task = asyncio.create_task(run())
        self.tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self.tasks.discard(t)
            self.finished.set()

        task.add_done_callback(done)

    async def _process(self, cmd: dict[str, Any], received: float) -> None:
        timeout = response_timeout(cmd.get("response_timeout"))
        deadline = None if timeout is None else received + timeout
        channel = str(cmd.get("channel") or "main")
        rid = cmd.get("request_id")
        kind = cmd.get("command_type", "jsonrpc")
        if deadline is not None and time.monotonic() >= deadline:
            return  # expired before it started: no answer (tunnel-client's rule)
        if kind == "session_termination":
            body: dict[str, Any] = {"resp_type": "session_termination_response", "resp_code": 204}
        elif kind != "jsonrpc" or not isinstance(cmd.get("jsonrpc"), dict):
            log.warning("command %s: unsupported command_type %r", rid, kind)
            return
        else:
            up = self.upstreams.get(channel)
            message = cmd["jsonrpc"]
            left = None if deadline is None else deadline - time.monotonic()
            if up is None:  # (tunnel-client's answer, never another channel's server)
                body = failure(
                    message,
                    "client_internal",
                    "unsupported_channel",
                    f"unsupported_channel: this connector serves no channel {channel!r}",
                )
            else:

                async def relay(up: HttpUpstream | StdioUpstream = up) -> dict[str, Any]:
                    async with self.slots:
                        return await up.forward(message, cmd.get("headers") or {})

                try:
                    body = await asyncio.wait_for(relay(), left)
                except TimeoutError:
                    self.metrics.commands.labels(channel, "expired").inc()
                    return
                self.metrics.up.labels(channel).set(1 if up.reachable else 0)
        outcome = "ok" if "error" not in (body.get("resp_json") or {}) else "error"
        self.metrics.commands.labels(channel, outcome).inc()
        self.metrics.seconds.labels(channel).observe(time.monotonic() - received)
        await self._post(
            {"request_id": rid, "channel": channel, **body},
            str(cmd.get("shard_token", "")),
            deadline,
        )

    async def _post(self, body: dict[str, Any], shard: str, deadline: float | None) -> None:
        path = f"/v1/tunnels/{self.cfg.gateway.tunnel_id}/response"
        delay = self.cfg.gateway.backoff_initial_s
        while True:
            pause = None
            try:
                r = await self.http.post(path, json=body, headers={"X-Tunnel-Shard-Token": shard})
                if r.status_code == 404:  # terminal: the gateway holds no such request
                    rid = body["request_id"]
                    log.warning("response to %s: the gateway holds no such request (404)", rid)
                    return
                if r.status_code not in RETRY_STATUS:
                    if r.status_code >= 400:
                        log.warning("response to %s refused: %s", body["request_id"], _explain(r))
                    return
                pause = retry_after(r, self.cfg.gateway.backoff_max_s)
            except httpx.HTTPError as e:
                log.warning("posting the response to %s failed: %s", body["request_id"], e)
            pause = random.uniform(0, delay) if pause is None else pause
            if deadline is not None and time.monotonic() + pause >= deadline:
                return
            await asyncio.sleep(pause)
            delay = min(delay * 2, self.cfg.gateway.backoff_max_s)

    # -- health --------------------------------------------------------------------------------
    def ready(self) -> tuple[bool, list[str]]:
        problems = [] if self.last_poll_ok else [f"gateway: {self.last_error}"]
        problems += [
            f"upstream {c}: not reachable"
            for c, u in self.upstreams.items()
            if u.reachable is False
        ]
        return not problems, problems

    async def _start_health(self) -> tuple[_Server, asyncio.Task[None]] | None:
        listen = self.cfg.health.listen
        if not listen:
            return None

        async def healthz(request: Request) -> Response:
            return JSONResponse({"status": "ok", "instance": self.instance})

        async def readyz(request: Request) -> Response:
            ok, problems = self.ready()
            return JSONResponse({"ready": ok, "problems": problems}, status_code=200 if ok else 503)

        async def metrics(request: Request) -> Response:
            return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

        app = Starlette(
            routes=[
                Route("/healthz", healthz),
                Route("/readyz", readyz),
                Route("/metrics", metrics),
            ]
        )
        if listen.startswith("unix:"):
            config = uvicorn.Config(
                app, uds=listen[5:], log_config=None, access_log=False, lifespan="off"
            )
        else:
            host, _, port = listen.rpartition(":")
            config = uvicorn.Config(
                app,
                host=host.strip("[]"),
                port=int(port),
                log_config=None,
                access_log=False,
                lifespan="off",
            )
        server = _Server(config)
        task = asyncio.create_task(server.serve())
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("the health listener did not start")
            await asyncio.sleep(0.02)
        if listen.startswith("unix:"):
            self.health_url = listen
        else:
            sock = server.servers[0].sockets[0].getsockname()
            self.health_url = f"http://{host}:{sock[1]}"
        if self.cfg.health.url_file:
            Path(self.cfg.health.url_file).write_text(self.health_url + "\n")
        return server, task


def _explain(r: httpx.Response) -> str:
    try:
        message = r.json().get("message") or r.json().get("error", {}).get("message")
    except ValueError:
        message = r.text[:200]
    hint = {401: "the gateway refused the token", 404: "the gateway has no such tunnel"}
    return f"HTTP {r.status_code}: {hint.get(r.status_code, message)}"


def connect(cfg: ConnectorConfig) -> None:
    asyncio.run(Connector(cfg).run())
