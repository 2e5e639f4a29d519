"""Running the E2B-compatible server under uvicorn (``sandhold serve``)."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from types import FrameType

import uvicorn

from sandhold.config import Settings
from sandhold.e2b.app import E2bApp, create_app
from sandhold.e2b.proxy import DeliberateAbort
from sandhold.listening import listening_host, no_delay

# Longer than the SDK's pool keep-alive (300 s): a server that closes idle connections first
# races with clients reusing them.
KEEP_ALIVE_S = 320
# Command and watch streams never end on their own; do not wait for them on shutdown.
GRACEFUL_SHUTDOWN_S = 2


def build_config(settings: Settings, fd: int | None = None) -> uvicorn.Config:
    """Serve on ``server_host:server_port``, or on the listening socket ``fd`` if given (bound
    by whoever started us: no port is released between choosing it and serving on it)."""
    settings.check_server_serve(settings.server_host if fd is None else listening_host(fd))
    settings.check_fleet_host()
    if fd is not None:
        no_delay(fd)
    config = uvicorn.Config(
        create_app(settings),
        host=settings.server_host,
        port=settings.server_port,
        fd=fd,
        http="httptools",
        loop="asyncio",
        lifespan="on",
        access_log=False,
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        backlog=2048,
        log_level="info",
        log_config=None,  # its records go to the root logger's handlers (sandhold.logs.setup)
    )
    # (after the Config: it configures logging) A response the data plane cuts off on purpose
    # is logged by the data plane, not as a broken application.
    logging.getLogger("uvicorn.error").addFilter(DeliberateAbort())
    return config


class FleetHostServer(uvicorn.Server):
    """A fleet host's server: the first SIGTERM drains (every sandbox stored and handed over,
    e2b/fleet_host.py) while the host keeps answering its edges, then exits; another SIGTERM,
    or SIGINT, exits at once."""

    def __init__(self, config: uvicorn.Config, app: E2bApp) -> None:
        super().__init__(config)
        self.app = app
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        fleet = self.app.fleet
        if sig == signal.SIGTERM and fleet is not None and self._loop and not fleet.jobs.draining:
            self._loop.call_soon_threadsafe(
                lambda: fleet.jobs.drain().add_done_callback(self._exit)
            )
            return
        super().handle_exit(sig, frame)

    def _exit(self, _: object) -> None:
        self.should_exit = True


def run(settings: Settings, fd: int | None = None) -> None:
    # Sandhold's own warnings (a sandbox that exited on its own, a failed expiry) and uvicorn's
    # lines go to the handlers ``sandhold.logs.setup`` installed (`sandhold serve`); to stderr
    # when none are.
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = build_config(settings, fd)
    app = config.app
    if isinstance(app, E2bApp) and app.fleet is not None:
        FleetHostServer(config, app).run()
    else:
        uvicorn.Server(config).run()
