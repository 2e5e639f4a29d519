"""`sandhold host drain`: drain the fleet host on this machine (a pod's preStop, docs/fleet.md)."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from sandhold.cli.common import fail, load_settings
from sandhold.errors import ConfigError, SandholdError

app = typer.Typer(help="The fleet host on this machine.")


@app.command()
def drain(
    url: Annotated[
        str | None, typer.Option(help="the host's API (default: http://127.0.0.1:server_port)")
    ] = None,
) -> None:
    """Stop admitting creates, store every sandbox in the shared store, wait until an edge has
    taken them over, and let the server exit; returns when it has (or its drain budget,
    fleet_drain_timeout_s, is spent)."""
    import httpx

    try:
        s = load_settings()
        if s.fleet_token is None:
            raise ConfigError("sandhold host drain needs fleet_token, as the host has it")
        base = url or f"http://127.0.0.1:{s.server_port}"
        headers = {"X-Sandhold-Fleet-Token": s.fleet_token.get_secret_value()}
        try:
            r = httpx.post(f"{base}/fleet/drain", headers=headers, timeout=30)
        except httpx.HTTPError as e:
            typer.echo(f"no host answers at {base} ({e}): nothing to drain")
            return
        if r.status_code != 202:
            raise ConfigError(f"the host refused to drain: {r.status_code} {r.text[:300]}")
        deadline = time.monotonic() + s.fleet_drain_timeout_s + 30
        while time.monotonic() < deadline:
            try:
                info = httpx.get(f"{base}/fleet/info", headers=headers, timeout=10).json()
            except (httpx.HTTPError, ValueError):
                typer.echo("drained: the host has exited")
                return
            typer.echo(f"draining: {info.get('unstored', '?')} sandboxes not yet stored")
            time.sleep(1)
        raise ConfigError("the host is still draining past fleet_drain_timeout_s")
    except SandholdError as e:
        fail(e)
