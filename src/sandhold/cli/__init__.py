"""The `sandhold` command."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from sandhold.cli.errors import exit_status
from sandhold.errors import Conflict, SandholdError

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
template_app = typer.Typer(no_args_is_help=True, help="Template root filesystems.")
sandbox_app = typer.Typer(no_args_is_help=True, help="Sandboxes on this host.")
app.add_typer(template_app, name="template")
app.add_typer(sandbox_app, name="sandbox")
console = Console()
err = Console(stderr=True)


def _runtime() -> Any:
    from sandhold.runtime.runtime import Runtime

    return Runtime().open()


def _fail(e: SandholdError) -> None:
    from rich.markup import escape

    err.print(f"[red]error[/red] ({e.code}): {escape(e.message)}")
    raise typer.Exit(exit_status(e))


def _pairs(values: list[str], what: str) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, val = v.partition("=")
        if not sep:
            raise typer.BadParameter(f"{what} {v!r} must look like KEY=VALUE")
        out[key] = val
    return out


@template_app.command("ls")
def template_ls() -> None:
    """List templates (building `base` on first use)."""
    try:
        rt = _runtime()
        rt.templates.get("base")
        table = Table("name", "kind", "user", "workdir", "rootfs")
        for t in rt.templates.list():
            table.add_row(t.name, t.kind, t.user, t.workdir, str(t.rootfs))
        console.print(table)
    except SandholdError as e:
        _fail(e)


@template_app.command("build")
def template_build(
    name: str,
    debootstrap: Annotated[str | None, typer.Option(help="Debian suite, e.g. bookworm")] = None,
    rootfs: Annotated[
        Path | None, typer.Option(help="Import this root filesystem directory")
    ] = None,
    mirror: str = "http://deb.debian.org/debian",
) -> None:
    """Build a template: a shipped one (`base`, `code-interpreter-v1`), from debootstrap, or
    from a root filesystem directory."""
    from sandhold.runtime.templates import BUILTIN_TEMPLATES

    try:
        rt = _runtime()
        if debootstrap and rootfs:
            raise typer.BadParameter("give --debootstrap or --rootfs, not both")
        if debootstrap:
            t = rt.templates.build_debootstrap(name, suite=debootstrap, mirror=mirror)
        elif rootfs:
            t = rt.templates.build_from_rootfs(name, rootfs.resolve())
        elif name in BUILTIN_TEMPLATES:
            t = rt.templates.build_builtin(name)
        else:
            t = rt.templates.build_base(name)
        console.print(f"built template [bold]{t.name}[/bold] ({t.kind}) at {t.rootfs}")
    except SandholdError as e:
        _fail(e)


@sandbox_app.command("create")
def sandbox_create(
    template: str = "base",
    memory_mb: Annotated[int | None, typer.Option(help="memory limit in MiB")] = None,
    cpu: Annotated[float | None, typer.Option(help="CPU quota in cores")] = None,
    pids: Annotated[int | None, typer.Option(help="max processes and threads")] = None,
    workspace: Annotated[str | None, typer.Option(help="workspace id bound at /workspace")] = None,
    env: Annotated[list[str], typer.Option("--env", "-e", help="KEY=VALUE")] = [],  # noqa: B006
    metadata: Annotated[list[str], typer.Option("--metadata", "-m", help="KEY=VALUE")] = [],  # noqa: B006
) -> None:
    """Create a sandbox; it keeps running after this command returns."""
    rt = _runtime()
    limits: dict[str, Any] = {
        "memory_mb": memory_mb or rt.settings.default_memory_mb,
        "cpu": cpu or rt.settings.default_cpu,
        "pids": pids or rt.settings.default_pids,
    }
    spec = {
        "template": template,
        "limits": limits,
        "env": _pairs(env, "--env"),
        "metadata": _pairs(metadata, "--metadata"),
        "workspace_id": workspace,
    }
    try:
        info = rt.create(spec)
    except SandholdError as e:
        _fail(e)
    console.print(info.id)


@sandbox_app.command("ls")
def sandbox_ls(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List sandboxes with their state and usage."""
    rt = _runtime()
    rows = []
    for info in rt.list():
        u = rt.usage(info.id)
        rows.append({
            "id": info.id, "template": info.template, "state": info.state,
            "workspace": info.spec.workspace_id, "memory_mb": round(u.memory_bytes / 2**20, 1),
            "cpu_s": round(u.cpu_seconds, 3), "pids": u.pids, "oom_kills": u.oom_kills,
            "metadata": info.metadata,
        })  # fmt: skip
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table("id", "template", "state", "workspace", "mem MiB", "cpu s", "pids", "ooms")
    for r in rows:
        cells = (r["memory_mb"], r["cpu_s"], r["pids"], r["oom_kills"])
        table.add_row(r["id"], r["template"], r["state"], r["workspace"] or "-", *map(str, cells))
    console.print(table)


@sandbox_app.command("exec")
def sandbox_exec(
    sandbox_id: str,
    command: Annotated[list[str], typer.Argument(help="command and arguments (after --)")],
    user: str | None = None,
    cwd: str | None = None,
) -> None:
    """Run a command inside a sandbox through its agent; exits with the command's exit code."""
    import shlex

    from sandhold.runtime.client import AgentClient

    rt = _runtime()
    try:
        info = rt.get(sandbox_id)
        if info.state == "paused":
            raise Conflict(f"sandbox {sandbox_id} is paused; resume it first")
    except SandholdError as e:
        _fail(e)

    async def go() -> int:
        async with AgentClient(info.agent_socket, timeout=None) as c:  # type: ignore[arg-type]
            res = await c.sh(shlex.join(command), user=user, cwd=cwd)
        sys.stdout.buffer.write(res.stdout)
        sys.stderr.buffer.write(res.stderr)
        return res.exit_code if res.exit_code is not None else 1

    try:
        code = asyncio.run(go())
    except SandholdError as e:  # the agent refused (EnvdError), or the sandbox went away
        _fail(e)
    raise typer.Exit(code)


def _simple(op: str) -> Any:
    def command(sandbox_id: str) -> None:
        rt = _runtime()
        try:
            getattr(rt, op)(sandbox_id)
        except SandholdError as e:
            _fail(e)
        console.print(f"{op}: {sandbox_id}")

    command.__doc__ = f"{op.capitalize()} a sandbox."
    return command


for _op in ("pause", "resume", "kill"):
    sandbox_app.command(_op)(_simple(_op))


@app.command()
def doctor() -> None:
    """Check the kernel features and tools the runtime needs, and say how to fix what is missing."""
    from sandhold.config import get_settings
    from sandhold.runtime.doctor import run_checks

    checks = run_checks(get_settings().uid_base)
    table = Table("check", "status", "detail", "fix")
    for c in checks:
        status = "[green]ok[/green]" if c.ok else ("[red]MISSING[/red]" if c.required else
                                                   "[yellow]optional[/yellow]")  # fmt: skip
        table.add_row(c.name, status, c.detail, "" if c.ok else c.fix)
    console.print(table)
    if any(c.required and not c.ok for c in checks):
        raise typer.Exit(1)


@app.command()
def demo(
    serve: Annotated[bool, typer.Option(help="keep serving after the tour")] = True,
) -> None:
    """Start the E2B-compatible server and drive it once with the official SDKs (`make run`)."""
    from sandhold.demo import main

    main(serve=serve)


FD_HELP = (
    "serve on this inherited, already listening socket instead of binding host and port "
    "(the API-key rule judges the socket's own address)"
)


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="listen address (default: server_host)")] = None,
    port: Annotated[int | None, typer.Option(help="listen port (default: server_port)")] = None,
    fd: Annotated[int | None, typer.Option("--fd", help=FD_HELP)] = None,
) -> None:
    """Run the E2B-compatible server: the official SDKs' API and sandbox traffic on one port."""
    from rich.markup import escape

    from sandhold.config import load
    from sandhold.e2b.server import run

    try:  # settings refused (ConfigError) exit 78 before anything listens
        given = {"server_host": host, "server_port": port}
        run(load(**{k: v for k, v in given.items() if v is not None}), fd)
    except ValueError as e:  # an --fd that is not a listening socket
        err.print(f"[red]error[/red]: {escape(str(e))}")
        raise typer.Exit(2) from None
    except SandholdError as e:
        _fail(e)


gateway_app = typer.Typer(no_args_is_help=True, help="The session gateway (MCP and REST tools).")
session_app = typer.Typer(no_args_is_help=True, help="Gateway sessions and their timelines.")
app.add_typer(gateway_app, name="gateway")
app.add_typer(session_app, name="session")


def _gateway_settings(**overrides: Any) -> Any:
    from sandhold.config import load

    return load(**{k: v for k, v in overrides.items() if v is not None})


def _gateway_run(fn: Any) -> None:
    from pydantic import ValidationError
    from rich.markup import escape

    try:  # settings refused (ConfigError) exit 78 before anything listens
        fn()
    except ValidationError as e:  # a tenant policy (configured, or given with --policy)
        err.print(f"[red]error[/red]: invalid settings: {escape(str(e))}")
        raise typer.Exit(2) from None
    except ValueError as e:  # a bad --fd, an unknown --tenant
        err.print(f"[red]error[/red]: {escape(str(e))}")
        raise typer.Exit(2) from None
    except SandholdError as e:
        _fail(e)


@gateway_app.command("serve")
def gateway_serve(
    host: Annotated[str | None, typer.Option(help="listen address (gateway_host)")] = None,
    port: Annotated[int | None, typer.Option(help="listen port (gateway_port)")] = None,
    replica_id: Annotated[str | None, typer.Option(help="name of this replica")] = None,
    fd: Annotated[int | None, typer.Option("--fd", help=FD_HELP)] = None,
) -> None:
    """Serve the tools over REST and MCP (streamable HTTP at /mcp); also runs the reclaimer."""
    from sandhold.gateway.server import serve

    _gateway_run(lambda: serve(_gateway_settings(
        gateway_host=host, gateway_port=port, gateway_replica_id=replica_id), fd))  # fmt: skip


@gateway_app.command("mcp")
def gateway_mcp(
    tenant: Annotated[str, typer.Option(help="tenant of every call")],
    session: Annotated[str | None, typer.Option(help="session of calls without one")] = None,
) -> None:
    """Serve the tools over MCP on stdin/stdout (for an agent that spawns its tool server)."""
    from sandhold.gateway.server import serve_stdio

    _gateway_run(lambda: serve_stdio(_gateway_settings(), tenant, session))


@gateway_app.command("tenant")
def gateway_tenant(
    tenant_id: str,
    policy: Annotated[str, typer.Option(help="policy as JSON (see docs/gateway.md)")] = "{}",
    api_key: Annotated[str | None, typer.Option(help="the tenant's API key")] = None,
) -> None:
    """Create or update a tenant and its policy in the store."""
    from sandhold.gateway.app import Gateway
    from sandhold.gateway.policy import ID_RE, TenantPolicy, check_id

    def go() -> None:
        gw = Gateway(_gateway_settings())
        gw.bootstrap()
        check_id(tenant_id, "tenant id", ID_RE)
        p = TenantPolicy.model_validate(json.loads(policy))
        gw.store.put_tenant(tenant_id, p.model_dump(), api_key)
        console.print_json(json.dumps({"tenant_id": tenant_id, "policy": p.model_dump()}))

    _gateway_run(go)


@gateway_app.command("reclaim")
def gateway_reclaim() -> None:
    """Run one reclaim pass now (as every replica does each gateway_reclaim_interval_s)."""
    from sandhold.gateway.app import Gateway

    async def go() -> None:
        gw = Gateway(_gateway_settings())
        async with gw.running(reclaim=False):
            report = await gw.reclaimer.run_pass()
        console.print_json(json.dumps(report.public()))

    _gateway_run(lambda: asyncio.run(go()))


def _store() -> Any:
    from sandhold.store.db import Store

    return Store(_gateway_settings().gateway_store)


@session_app.command("ls")
def session_ls(tenant: Annotated[str | None, typer.Option(help="only this tenant")] = None) -> None:
    """List sessions with their current sandbox."""
    table = Table("tenant", "session", "state", "sandbox", "created")
    for r in _store().sessions(tenant):
        table.add_row(r.tenant_id, r.session_id, r.state, r.sandbox_id or "-",
                      _when(r.created_at))  # fmt: skip
    console.print(table)


@session_app.command("timeline")
def session_timeline(
    session_id: str,
    tenant: Annotated[str | None, typer.Option(help="tenant (needed if ambiguous)")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Show a session's timeline: lifecycle events and tool calls, with durations."""
    from sandhold.gateway.timeline import event_json

    store = _store()
    rows = [r for r in store.sessions(tenant) if r.session_id == session_id]
    if len(rows) != 1:
        err.print(f"[red]error[/red]: {len(rows)} sessions named {session_id!r}; use --tenant")
        raise typer.Exit(2)
    events = sorted(store.timeline(rows[0].tenant_id, session_id), key=lambda e: (e.at, e.id))
    if as_json:
        print(json.dumps([event_json(e) for e in events], indent=2))
        return
    table = Table("at", "event", "sandbox", "tool", "ms", "exit", "in/out", "reason / error")
    for e in events:
        io = f"{e.bytes_in}/{e.bytes_out}" if e.bytes_in is not None else ""
        table.add_row(_when(e.at), e.kind, e.sandbox_id or "", e.tool or "",
                      "" if e.duration_ms is None else f"{e.duration_ms:.0f}",
                      "" if e.exit_code is None else str(e.exit_code), io,
                      e.error or e.reason or "")  # fmt: skip
    console.print(table)


@session_app.command("stats")
def session_stats(tenant: str) -> None:
    """Per-tenant aggregates: sessions, live sandboxes, events and tool calls."""
    console.print_json(json.dumps(_store().aggregates(tenant)))


def _when(ts: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


# -- secrets (credential custody for the egress proxy; see docs/egress.md) ------------------------
secret_app = typer.Typer(
    no_args_is_help=True,
    help="Tenant credentials: stored encrypted, injected by the egress proxy, never shown.",
)
app.add_typer(secret_app, name="secret")


def _secrets() -> Any:
    from sandhold.config import get_settings
    from sandhold.egress.secrets import open_store

    s = get_settings()
    return open_store(s.data_dir, s.secrets_keys, s.secrets_key_file)


@secret_app.command("set")
def secret_set(
    tenant: str,
    name: str,
    host: Annotated[list[str], typer.Option(help="domain or *.domain to inject into (repeat)")],
    header: Annotated[str, typer.Option(help="header the credential goes into")] = "Authorization",
    format: Annotated[str, typer.Option(help="header value; {secret} is the credential")] = (
        "Bearer {secret}"
    ),
) -> None:
    """Store a secret, read from stdin (never from the command line, which `ps` shows)."""
    if sys.stdin.isatty():
        value = typer.prompt("secret value", hide_input=True)
    else:
        value = sys.stdin.read().rstrip("\r\n")
    try:
        info = _secrets().set(tenant, name, value, host, header=header, format=format)
    except SandholdError as e:
        _fail(e)
    console.print(f"stored secret {info.name!r} of tenant {info.tenant!r} for {', '.join(host)}")


@secret_app.command("ls")
def secret_ls(
    tenant: Annotated[str | None, typer.Option(help="only this tenant")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List secrets (names, hosts and headers; never values)."""
    try:
        items = _secrets().list(tenant)
    except SandholdError as e:
        _fail(e)
    if as_json:
        print(json.dumps([i.to_json() for i in items]))
        return
    table = Table("tenant", "name", "hosts", "header", "format", "key")
    for i in items:
        table.add_row(i.tenant, i.name, ", ".join(i.hosts), i.header, i.format, i.key_id)
    console.print(table)


@secret_app.command("rm")
def secret_rm(tenant: str, name: str) -> None:
    """Delete a secret."""
    try:
        _secrets().remove(tenant, name)
    except SandholdError as e:
        _fail(e)
    console.print(f"removed secret {name!r} of tenant {tenant!r}")


@secret_app.command("rotate-key")
def secret_rotate_key() -> None:
    """Add a new key (key file) and re-encrypt every secret with the newest key."""
    try:
        store = _secrets()
        if store.keyring.file is not None:
            store.keyring.add_new_key()
        n = store.rotate()
    except SandholdError as e:
        _fail(e)
    console.print(f"re-encrypted {n} secret(s) with key {store.keyring.current[0]}")


@secret_app.command("new-key")
def secret_new_key() -> None:
    """Print a fresh key for the secrets_keys setting."""
    from sandhold.egress.secrets import new_key

    print(new_key())


@app.command()
def audit(
    log: Annotated[str, typer.Argument(help="files (the E2B file API) or egress")],
    sandbox: Annotated[str | None, typer.Option(help="only this sandbox")] = None,
    session: Annotated[str | None, typer.Option(help="only this session")] = None,
    decision: Annotated[
        str | None, typer.Option(help="allowed, denied, failed (files); allow, deny (egress)")
    ] = None,
    since: Annotated[float, typer.Option(help="only the last N seconds")] = 86400.0,
    limit: Annotated[int, typer.Option(help="at most N records, the latest")] = 1000,
) -> None:
    """Print an audit log as JSON lines (oldest first)."""
    import time

    from sandhold import audit as logs
    from sandhold.config import get_settings

    dirs = {"files": logs.files_dir, "egress": logs.egress_dir}
    if log not in dirs:
        console.print(f"[red]error[/red]: unknown audit log {log!r}: use files or egress")
        raise typer.Exit(2)
    directory = dirs[log](get_settings().data_dir)
    records = logs.query(directory, since=time.time() - since, limit=limit,
                         sandbox=sandbox, session=session, decision=decision)  # fmt: skip
    for rec in records:
        print(json.dumps(rec))


if __name__ == "__main__":
    app()
