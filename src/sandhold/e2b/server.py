"""Running the E2B-compatible server under uvicorn (``sandhold serve``)."""

from __future__ import annotations

import logging

import uvicorn

from sandhold.config import Settings
from sandhold.e2b.app import create_app
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


def run(settings: Settings, fd: int | None = None) -> None:
    # Sandhold's own warnings (a sandbox that exited on its own, a failed expiry) and uvicorn's
    # lines go to the handlers ``sandhold.logs.setup`` installed (`sandhold serve`); to stderr
    # when none are.
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    uvicorn.Server(build_config(settings, fd)).run()
