"""`sandhold sandbox`: the sandboxes of this host, straight on the runtime (no server)."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from sandhold.cli.common import console, fail, runtime
from sandhold.errors import SandholdError

app = typer.Typer(no_args_is_help=True, help="Sandboxes on this host.")


def _pairs(values: list[str], what: str) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, val = v.partition("=")
        if not sep:
            raise typer.BadParameter(f"{what} {v!r} must look like KEY=VALUE")
        out[key] = val
    return out


@app.command("create")
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
    from sandhold.config import get_settings
    from sandhold.service.limits import check_create
    from sandhold.service.records import CreateSandbox

    try:
        envs, pairs = _pairs(env, "--env"), _pairs(metadata, "--metadata")
        # The service's bounds of a create, before anything is made (the CLI's sandboxes have
        # no lifecycle record, so no timeout: the server's timers leave them alone).
        check_create(
            CreateSandbox(owner="cli", template=template, timeout_s=0, env=envs, metadata=pairs),
            get_settings(),
        )
        rt = runtime()
        limits: dict[str, Any] = {
            "memory_mb": memory_mb or rt.settings.default_memory_mb,
            "cpu": cpu or rt.settings.default_cpu,
            "pids": pids or rt.settings.default_pids,
        }
        spec = {
            "template": template,
            "limits": limits,
            "env": envs,
            "metadata": pairs,
            "workspace_id": workspace,
        }
        info = rt.create(spec)
    except SandholdError as e:
        fail(e)
    console.print(info.id)


@app.command("ls")
def sandbox_ls(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List sandboxes with their state and usage."""
    import json

    from rich.table import Table

    try:
        rt = runtime()
        rows = []
        for info in rt.list():
            u = rt.usage(info.id)
            rows.append(
                {
                    "id": info.id,
                    "template": info.template,
                    "state": info.state,
                    "workspace": info.spec.workspace_id,
                    "memory_mb": round(u.memory_bytes / 2**20, 1),
                    "cpu_s": round(u.cpu_seconds, 3),
                    "pids": u.pids,
                    "oom_kills": u.oom_kills,
                    "metadata": info.metadata,
                }
            )
    except SandholdError as e:
        fail(e)
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table("id", "template", "state", "workspace", "mem MiB", "cpu s", "pids", "ooms")
    for r in rows:
        cells = (r["memory_mb"], r["cpu_s"], r["pids"], r["oom_kills"])
        table.add_row(r["id"], r["template"], r["state"], r["workspace"] or "-", *map(str, cells))
    console.print(table)


@app.command("exec")
def sandbox_exec(
    sandbox_id: str,
    command: Annotated[list[str], typer.Argument(help="command and arguments (after --)")],
    user: str | None = None,
    cwd: str | None = None,
) -> None:
    """Run a command inside a sandbox through its agent; exits with the command's exit code."""
    import asyncio
    import shlex

    from sandhold.errors import Conflict
    from sandhold.runtime.client import AgentClient

    try:
        info = runtime().get(sandbox_id)
        if info.state == "paused":
            raise Conflict(f"sandbox {sandbox_id} is paused; resume it first")
    except SandholdError as e:
        fail(e)

    async def go() -> int:
        async with AgentClient(info.agent_socket, timeout=None) as c:
            res = await c.sh(shlex.join(command), user=user, cwd=cwd)
        sys.stdout.buffer.write(res.stdout)
        sys.stderr.buffer.write(res.stderr)
        return res.exit_code if res.exit_code is not None else 1

    try:
        code = asyncio.run(go())
    except SandholdError as e:  # the agent refused (EnvdError), or the sandbox went away
        fail(e)
    raise typer.Exit(code)


def _simple(op: str) -> Any:
    def command(sandbox_id: str) -> None:
        try:
            getattr(runtime(), op)(sandbox_id)
        except SandholdError as e:
            fail(e)
        console.print(f"{op}: {sandbox_id}")

    command.__doc__ = f"{op.capitalize()} a sandbox."
    return command


for _op in ("pause", "resume", "kill"):
    app.command(_op)(_simple(_op))
