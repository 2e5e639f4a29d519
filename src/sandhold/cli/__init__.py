"""The `sandhold` command.

Modules:

- ``__main__.py``: ``python -m sandhold.cli``: what the tests and benchmarks start servers with
- ``audit.py``: `sandhold audit`: the file-API and egress audit logs, as JSON lines
- ``common.py``: What the command groups share
- ``errors.py``: The CLI's wire table: the exit status of a command that failed with a leaf of the
  error
- ``edge.py``: `sandhold edge serve`: the fleet's edge (docs/fleet.md)
- ``host.py``: `sandhold host drain`: drain the fleet host on this machine (a pod's preStop)
- ``gateway.py``: `sandhold gateway`: the session gateway, serving its tools (REST and MCP) and
  administered
- ``init.py``: `sandhold init -- COMMAND...`: a small init for a container or pod, whose PID 1 it
  is
- ``logs.py``: `sandhold logs`: read and filter the JSON-lines logs of `sandhold serve` and
  `sandhold
- ``sandboxes.py``: `sandhold sandbox`: the sandboxes of this host, straight on the runtime (no
  server)
- ``secrets.py``: `sandhold secret`: tenant credentials in custody for the egress proxy (see
  docs/egress.md)
- ``server.py``: The top-level commands around the E2B-compatible server: `doctor`, `demo` and
  `serve`
- ``sessions.py``: `sandhold session`: the gateway's sessions and their timelines, read from its
  store
- ``template_build.py``: `sandhold template build -f Dockerfile NAME`
- ``templates.py``: `sandhold template`: the templates of this host
- ``top.py``: `sandhold top`: a live terminal view of what the console shows, from its JSON API
- ``tunnel.py``: `sandhold tunnel`: MCP tunnels into private networks (docs/tunnel.md)
- ``worker.py``: `sandhold worker`: serve a self-hosted environment of a Managed-Agents-compatible
  control
"""

from __future__ import annotations

import typer

from sandhold.cli import (
    audit,
    edge,
    gateway,
    host,
    init,
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
app.command()(init.init)
app.add_typer(templates.app, name="template")
app.add_typer(sandboxes.app, name="sandbox")
app.add_typer(gateway.app, name="gateway")
app.add_typer(sessions.app, name="session")
app.add_typer(secrets.app, name="secret")
app.add_typer(tunnel.app, name="tunnel")
app.add_typer(edge.app, name="edge")
app.add_typer(host.app, name="host")

__all__ = ["app"]

if __name__ == "__main__":
    app()
