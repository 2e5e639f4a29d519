"""`sandhold edge serve`: the fleet's edge (docs/fleet.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from sandhold.cli.common import FD_HELP, fail, load_settings
from sandhold.errors import SandholdError

app = typer.Typer(help="The fleet's edge: one E2B endpoint in front of many hosts.")


@app.command()
def serve(
    host: Annotated[
        str | None, typer.Option(help="listen address (default: fleet_edge_host)")
    ] = None,
    port: Annotated[int | None, typer.Option(help="listen port (default: fleet_edge_port)")] = None,
    fd: Annotated[int | None, typer.Option("--fd", help=FD_HELP)] = None,
) -> None:
    """Serve the E2B API over the fleet: placement, the catalog, routing to hosts."""
    import uvicorn

    from sandhold.fleet.edge import Edge
    from sandhold.listening import listening_host, no_delay
    from sandhold.logs import setup

    try:
        settings = load_settings(fleet_edge_host=host, fleet_edge_port=port)
        setup(settings, "edge")
        settings.check_server_serve(settings.fleet_edge_host if fd is None else listening_host(fd))
        if fd is not None:
            no_delay(fd)
        uvicorn.run(
            Edge(settings),
            host=settings.fleet_edge_host,
            port=settings.fleet_edge_port,
            fd=fd,
            http="httptools",
            lifespan="on",
            access_log=False,
            timeout_keep_alive=320,
            log_config=None,
        )
    except SandholdError as e:
        fail(e)
