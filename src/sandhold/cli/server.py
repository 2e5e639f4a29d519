"""The top-level commands around the E2B-compatible server: `doctor`, `demo` and `serve`."""

from __future__ import annotations

from typing import Annotated

import typer

from sandhold.cli.common import FD_HELP, console, fail, load_settings
from sandhold.errors import HostUnsupported, SandholdError


def doctor() -> None:
    """Check the kernel features and tools the runtime needs, and say how to fix what is missing."""
    from rich.table import Table

    from sandhold.config import get_settings
    from sandhold.runtime.doctor import run_checks

    try:
        settings = get_settings()
        checks = run_checks(settings.uid_base, settings.uid_ranges, settings.criu_path)
    except SandholdError as e:
        fail(e)
    table = Table("check", "status", "detail", "fix")
    for c in checks:
        status = (
            "[green]ok[/green]"
            if c.ok
            else ("[red]MISSING[/red]" if c.required else "[yellow]optional[/yellow]")
        )
        table.add_row(c.name, status, c.detail, "" if c.ok else c.fix)
    console.print(table)
    missing = [c.name for c in checks if c.required and not c.ok]
    if missing:  # what HostUnsupported exits with (69), not 1, which is Python's for a bug
        fail(
            HostUnsupported(
                f"{len(missing)} required check(s) failed: {', '.join(missing)} "
                "(see the fix column)"
            )
        )


def demo(
    serve: Annotated[bool, typer.Option(help="keep serving after the tour")] = True,
) -> None:
    """Start the E2B-compatible server and drive it once with the official SDKs (`make run`)."""
    from sandhold.demo import main

    try:
        main(serve=serve)
    except SandholdError as e:  # settings refused (ConfigError) before the server starts
        fail(e)


def serve(
    host: Annotated[str | None, typer.Option(help="listen address (default: server_host)")] = None,
    port: Annotated[int | None, typer.Option(help="listen port (default: server_port)")] = None,
    fd: Annotated[int | None, typer.Option("--fd", help=FD_HELP)] = None,
) -> None:
    """Run the E2B-compatible server: the official SDKs' API and sandbox traffic on one port.
    Logs go to stderr and to log_dir/server.jsonl (`sandhold logs`)."""

    from sandhold.e2b.server import run
    from sandhold.logs import setup

    try:  # settings refused (ConfigError) exit 78 before anything listens
        settings = load_settings(server_host=host, server_port=port)
        setup(settings, "server")
        run(settings, fd)
    except SandholdError as e:  # ConfigError, an --fd that is not a listening socket, ...
        fail(e)
