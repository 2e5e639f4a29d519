"""`sandhold tunnel`: MCP tunnels into private networks (docs/tunnel.md).

Administration works on the gateway's store, as `sandhold gateway tenant` does (the same
settings: SANDHOLD_GATEWAY_STORE_URL, SANDHOLD_SECRETS_KEYS); the admin API offers the same
over HTTP. `connect` and `doctor` run inside the private network and need only their config.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from sandhold.cli.common import console, err, fail, load_settings
from sandhold.errors import SandholdError

app = typer.Typer(no_args_is_help=True, help="MCP tunnels: a connector in a private network.")


def _run(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except SandholdError as e:
        fail(e)


def _registry() -> Any:
    from sandhold.gateway.app import Gateway
    from sandhold.tunnel.registry import Registry

    settings = load_settings()
    gw = Gateway(settings)
    gw.bootstrap()
    return Registry(settings, gw.store)


@app.command("create")
def tunnel_create(
    tenant: Annotated[str, typer.Argument(help="the tenant whose sessions get its tools")],
    name: Annotated[str, typer.Argument(help="prefix of its tools (<name>__<tool>)")],
    description: Annotated[str, typer.Option(help="what it reaches")] = "",
) -> None:
    """Register a tunnel; prints its id and token (keep the token secret)."""

    def go() -> None:
        info, token = _registry().create(tenant, name, description)
        console.print_json(json.dumps({**info.public(), "token": token}))

    _run(go)


@app.command("list")
def tunnel_list(
    tenant: Annotated[str | None, typer.Option(help="only this tenant's")] = None,
) -> None:
    """The tunnels and the connectors seen polling them."""

    def go() -> None:
        stale = load_settings().gateway_tunnel_stale_s
        console.print_json(json.dumps([t.public(stale) for t in _registry().list(tenant)]))

    _run(go)


@app.command("delete")
def tunnel_delete(tunnel_id: str) -> None:
    """Delete a tunnel: its token stops working and its tools disappear."""
    _run(lambda: _registry().delete(tunnel_id))
    console.print(f"deleted {tunnel_id}")


@app.command("token")
def tunnel_token(
    tunnel_id: str,
    rotate: Annotated[bool, typer.Option(help="issue a new token (the old one stops)")] = False,
) -> None:
    """Print the tunnel's token (opened from its sealed copy), or a new one with --rotate."""

    def go() -> None:
        reg = _registry()
        console.print(reg.rotate(tunnel_id) if rotate else reg.reveal(tunnel_id), markup=False)

    _run(go)


@app.command("connect")
def tunnel_connect(config: Annotated[Path, typer.Option(help="the connector's TOML file")]) -> None:
    """Run the connector: poll the gateway, relay to the internal MCP servers, answer."""
    import logging

    from sandhold.tunnel.connector import connect
    from sandhold.tunnel.connector_config import load

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    _run(lambda: connect(load(config)))


@app.command("doctor")
def tunnel_doctor(config: Annotated[Path, typer.Option(help="the connector's TOML file")]) -> None:
    """Explain why the connector cannot reach the gateway or an internal MCP server."""
    from rich.markup import escape

    from sandhold.tunnel.connector_config import load
    from sandhold.tunnel.doctor import diagnose

    checks = _run(lambda: diagnose(load(config)))
    for c in checks:
        mark = "[green]ok[/green]  " if c.ok else "[red]FAIL[/red]"
        (console if c.ok else err).print(f"{mark} {c.name}: {escape(c.detail)}")
    if not all(c.ok for c in checks):
        raise typer.Exit(1)
