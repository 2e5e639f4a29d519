"""The `sandhold` command."""

from __future__ import annotations

import typer

from sandhold.cli import (
    audit,
    gateway,
    logs,
    sandboxes,
    secrets,
    server,
    sessions,
    templates,
    top,
    tunnel,
)
from sandhold.cli.worker import worker

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
for _command in (server.doctor, server.demo, server.serve, audit.audit, logs.logs, top.top, worker):
    app.command()(_command)
app.add_typer(templates.app, name="template")
app.add_typer(sandboxes.app, name="sandbox")
app.add_typer(gateway.app, name="gateway")
app.add_typer(sessions.app, name="session")
app.add_typer(secrets.app, name="secret")
app.add_typer(tunnel.app, name="tunnel")

__all__ = ["app"]

if __name__ == "__main__":
    app()
