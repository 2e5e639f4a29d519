"""`sandhold gateway`: the session gateway, serving its tools (REST and MCP) and administered."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any

import typer

from sandhold.cli.common import FD_HELP, console, fail, load_settings
from sandhold.errors import InvalidRequest, SandholdError

app = typer.Typer(no_args_is_help=True, help="The session gateway (MCP and REST tools).")


def _run(fn: Callable[[], Any]) -> None:
    from pydantic import ValidationError

    try:  # settings refused (ConfigError) exit 78 before anything listens
        fn()
    except ValidationError as e:  # a tenant policy (configured, or given with --policy)
        fail(InvalidRequest(f"invalid tenant policy: {e}"))
    except SandholdError as e:  # a bad --fd, an unknown --tenant, ...
        fail(e)


@app.command("serve")
def gateway_serve(
    host: Annotated[str | None, typer.Option(help="listen address (gateway_host)")] = None,
    port: Annotated[int | None, typer.Option(help="listen port (gateway_port)")] = None,
    replica_id: Annotated[str | None, typer.Option(help="name of this replica")] = None,
    fd: Annotated[int | None, typer.Option("--fd", help=FD_HELP)] = None,
) -> None:
    """Serve the tools over REST and MCP (streamable HTTP at /mcp); also runs the reclaimer.
    Logs go to stderr and to log_dir/gateway.jsonl (`sandhold logs`)."""
    from sandhold.gateway.server import serve
    from sandhold.logs import setup

    def go() -> None:
        settings = load_settings(
            gateway_host=host, gateway_port=port, gateway_replica_id=replica_id
        )
        setup(settings, "gateway")
        serve(settings, fd)

    _run(go)


@app.command("mcp")
def gateway_mcp(
    tenant: Annotated[str, typer.Option(help="tenant of every call")],
    session: Annotated[str | None, typer.Option(help="session of calls without one")] = None,
) -> None:
    """Serve the tools over MCP on stdin/stdout (for an agent that spawns its tool server)."""
    from sandhold.gateway.server import serve_stdio

    _run(lambda: serve_stdio(load_settings(), tenant, session))


@app.command("tenant")
def gateway_tenant(
    tenant_id: str,
    policy: Annotated[str, typer.Option(help="policy as JSON (see docs/gateway.md)")] = "{}",
    api_key: Annotated[str | None, typer.Option(help="the tenant's API key")] = None,
) -> None:
    """Create or update a tenant and its policy in the store."""
    from sandhold.gateway.app import Gateway
    from sandhold.gateway.policy import ID_RE, TenantPolicy, check_id

    def go() -> None:
        gw = Gateway(load_settings())
        gw.bootstrap()
        check_id(tenant_id, "tenant id", ID_RE)
        try:
            raw = json.loads(policy)
        except ValueError as e:
            raise InvalidRequest(f"--policy is not valid JSON: {e}") from None
        p = TenantPolicy.model_validate(raw)
        gw.store.put_tenant(tenant_id, p.model_dump(), api_key)
        console.print_json(json.dumps({"tenant_id": tenant_id, "policy": p.model_dump()}))

    _run(go)


@app.command("reclaim")
def gateway_reclaim() -> None:
    """Run one reclaim pass now (as every replica does each gateway_reclaim_interval_s)."""
    import asyncio

    from sandhold.gateway.app import Gateway

    async def go() -> None:
        gw = Gateway(load_settings())
        async with gw.running(reclaim=False):
            report = await gw.reclaimer.run_pass()
        console.print_json(json.dumps(report.public()))

    _run(lambda: asyncio.run(go()))
