"""`sandhold worker`: serve a self-hosted environment of a Managed-Agents-compatible control plane,
running each session's tools in its Sandhold sandbox (docs/worker.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from sandhold.cli.common import fail, load_settings
from sandhold.errors import SandholdError


def worker(
    base_url: Annotated[
        str | None, typer.Option(help="the control plane (worker_base_url; ANTHROPIC_BASE_URL)")
    ] = None,
    environment_id: Annotated[
        str | None,
        typer.Option(
            help="the environment served (worker_environment_id; ANTHROPIC_ENVIRONMENT_ID)"
        ),
    ] = None,
    gateway_url: Annotated[
        str | None, typer.Option(help="the Sandhold gateway (worker_gateway_url)")
    ] = None,
    worker_id: Annotated[
        str | None, typer.Option(help="this worker's id on each poll (worker_id)")
    ] = None,
) -> None:
    """Poll an environment's work queue and serve each session's tool calls (bash, read, write,
    edit, glob, grep) in the session's sandbox through the gateway. Keys come from the
    environment only: SANDHOLD_WORKER_ENVIRONMENT_KEY (or ANTHROPIC_ENVIRONMENT_KEY) and
    SANDHOLD_WORKER_GATEWAY_KEY. SIGTERM releases the current item and exits 0."""
    import asyncio

    from sandhold.logs import setup
    from sandhold.worker.runner import serve

    try:
        settings = load_settings(
            worker_base_url=base_url,
            worker_environment_id=environment_id,
            worker_gateway_url=gateway_url,
            worker_id=worker_id,
        )
        settings.check_worker()
        setup(settings, "worker")
        status = asyncio.run(serve(settings))
    except SandholdError as e:
        fail(e)
    raise typer.Exit(status)
