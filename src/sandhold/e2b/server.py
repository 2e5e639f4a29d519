"""Running the E2B-compatible server under uvicorn (``sandhold serve``)."""

from __future__ import annotations

import logging

import uvicorn

from sandhold.config import Settings
from sandhold.e2b.app import create_app
from sandhold.e2b.auth import check_bind

# Longer than the SDK's pool keep-alive (300 s): a server that closes idle connections first
# races with clients reusing them.
KEEP_ALIVE_S = 320
# Command and watch streams never end on their own; do not wait for them on shutdown.
GRACEFUL_SHUTDOWN_S = 2


def build_config(settings: Settings) -> uvicorn.Config:
    check_bind(settings)
    return uvicorn.Config(
        create_app(settings),
        host=settings.server_host,
        port=settings.server_port,
        http="h11",
        loop="asyncio",
        lifespan="on",
        access_log=False,
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        backlog=2048,
        log_level="info",
    )


def run(settings: Settings) -> None:
    # Sandhold's own warnings (a sandbox that exited on its own, a failed expiry) go to stderr
    # next to uvicorn's lines.
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    uvicorn.Server(build_config(settings)).run()
