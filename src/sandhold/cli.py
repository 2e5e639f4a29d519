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

from sandhold.errors import SandholdError

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
template_app = typer.Typer(no_args_is_help=True, help="Template root filesystems.")
sandbox_app = typer.Typer(no_args_is_help=True, help="Sandboxes on this host.")
app.add_typer(template_app, name="template")
app.add_typer(sandbox_app, name="sandbox")
console = Console()
err = Console(stderr=True)


def _runtime() -> Any:
    from sandhold.runtime.runtime import Runtime

    return Runtime()


def _fail(e: SandholdError) -> None:
    err.print(f"[red]error[/red] ({e.code}): {e.message}")
    raise typer.Exit(2)


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
    """Build a template: `base` from the host, or from debootstrap, or from a rootfs directory."""
    try:
        rt = _runtime()
        if debootstrap and rootfs:
            raise typer.BadParameter("give --debootstrap or --rootfs, not both")
        if debootstrap:
            t = rt.templates.build_debootstrap(name, suite=debootstrap, mirror=mirror)
        elif rootfs:
            t = rt.templates.build_from_rootfs(name, rootfs.resolve())
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
        info = asyncio.run(rt.create(spec))
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

    from sandhold.runtime.client import AgentClient, AgentError

    rt = _runtime()
    try:
        info = rt.get(sandbox_id)
        if info.state == "paused":
            raise SandholdError(f"sandbox {sandbox_id} is paused; resume it first")
    except SandholdError as e:
        _fail(e)

    async def go() -> int:
        async with AgentClient(info.agent_socket, timeout=None) as c:  # type: ignore[arg-type]
            res = await c.run(shlex.join(command), user=user, cwd=cwd)
        sys.stdout.buffer.write(res.stdout)
        sys.stderr.buffer.write(res.stderr)
        return res.exit_code

    try:
        code = asyncio.run(go())
    except AgentError as e:
        err.print(f"[red]error[/red] ({e.code}): {e.message}")
        raise typer.Exit(2) from None
    raise typer.Exit(code)


def _simple(op: str) -> Any:
    def command(sandbox_id: str) -> None:
        rt = _runtime()
        try:
            asyncio.run(getattr(rt, op)(sandbox_id))
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


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="listen address (default: server_host)")] = None,
    port: Annotated[int | None, typer.Option(help="listen port (default: server_port)")] = None,
) -> None:
    """Run the E2B-compatible server: the official SDKs' API and sandbox traffic on one port."""
    from pydantic import ValidationError
    from rich.markup import escape

    from sandhold.config import Settings, get_settings
    from sandhold.e2b.server import run

    try:
        given = {"server_host": host, "server_port": port}
        overrides = {k: v for k, v in given.items() if v is not None}
        settings = Settings(**{**get_settings().model_dump(), **overrides})
        run(settings)
    except ValidationError as e:
        err.print(f"[red]error[/red]: invalid settings: {escape(str(e))}")
        raise typer.Exit(2) from None
    except ValueError as e:  # a dangerous configuration, refused before listening
        err.print(f"[red]error[/red]: {escape(str(e))}")
        raise typer.Exit(2) from None
    except SandholdError as e:
        _fail(e)


if __name__ == "__main__":
    app()
