"""`sandhold template`: the templates of this host: list, build (a shipped one, debootstrap, a
root filesystem directory, a Dockerfile: cli/template_build.py), remove, and a build's log."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer

from sandhold.cli.common import console, fail, runtime
from sandhold.errors import Conflict, InvalidRequest, SandholdError, TemplateNotFound

app = typer.Typer(
    no_args_is_help=True, help="Templates: root filesystems and the layers built on them."
)


@app.command("ls")
def template_ls() -> None:
    """List templates (building `base` on first use)."""
    from rich.table import Table

    try:
        rt = runtime()
        rt.templates.get("base")
        table = Table("name", "kind", "layers", "owner", "tags", "created")
        for t in rt.templates.list():
            created = datetime.fromtimestamp(t.created_at).strftime("%Y-%m-%d %H:%M:%S")
            table.add_row(
                t.name,
                t.kind,
                str(len(t.layers)),
                t.owner or "-",
                ", ".join(t.tags) or "-",
                created,
            )
        console.print(table)
    except SandholdError as e:
        fail(e)


@app.command("build")
def template_build(
    name: str,
    file: Annotated[
        Path | None, typer.Option("-f", "--file", help="Build from this Dockerfile")
    ] = None,
    context: Annotated[
        Path | None,
        typer.Option(help="The Dockerfile's build context (default: the Dockerfile's directory)"),
    ] = None,
    build_arg: Annotated[
        list[str] | None, typer.Option("--build-arg", help="NAME=VALUE for an ARG (repeatable)")
    ] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Rebuild every step")] = False,
    cpu: Annotated[float | None, typer.Option(help="Default CPUs of its sandboxes")] = None,
    memory_mb: Annotated[
        int | None, typer.Option(help="Default memory (MiB) of its sandboxes")
    ] = None,
    ready_cmd: Annotated[
        str | None,
        typer.Option(help="With CMD/ENTRYPOINT: the command that exits 0 once it serves"),
    ] = None,
    debootstrap: Annotated[str | None, typer.Option(help="Debian suite, e.g. bookworm")] = None,
    rootfs: Annotated[
        Path | None, typer.Option(help="Import this root filesystem directory")
    ] = None,
    mirror: Annotated[
        str | None, typer.Option(help="Debian archive URI (default: this machine's apt sources')")
    ] = None,
) -> None:
    """Build a template: from a Dockerfile (-f), a shipped one (`base`, `code-interpreter-v1`),
    from debootstrap, or from a root filesystem directory."""
    from sandhold.cli.template_build import build_dockerfile
    from sandhold.runtime.templates.store import BUILTIN_TEMPLATES

    if sum(x is not None for x in (file, debootstrap, rootfs)) > 1:
        raise typer.BadParameter("give one of -f, --debootstrap and --rootfs")
    dockerfile_only = {"--context": context, "--build-arg": build_arg or None, "--cpu": cpu,
                       "--memory-mb": memory_mb, "--ready-cmd": ready_cmd,
                       "--no-cache": no_cache or None}  # fmt: skip
    if file is None and (given := [k for k, v in dockerfile_only.items() if v is not None]):
        raise typer.BadParameter(f"{', '.join(given)} go(es) with -f")
    try:
        rt = runtime()
        if file is not None:
            t = build_dockerfile(
                rt, name, file, context, build_arg or [], no_cache, cpu, memory_mb, ready_cmd
            )
            console.print(f"built template [bold]{t.name}[/bold]: {len(t.layers)} layers")
            return
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
        fail(e)


@app.command("rm")
def template_rm(name: str) -> None:
    """Remove a template, its warm checkpoint and the layers no other template uses. Refused
    for `base`, a template others are built on, and one with sandboxes."""
    from sandhold.cli.template_build import dependents
    from sandhold.runtime.spec import NAME_RE
    from sandhold.runtime.templates.build import log_path

    try:
        rt = runtime()
        if name == "base":
            raise Conflict("template 'base' is built in: every template stands on it")
        if not NAME_RE.match(name) or not (rt.templates.root / name / "template.json").exists():
            raise TemplateNotFound(f"template {name!r} does not exist")
        t = rt.templates.get(name)
        if users := dependents(rt, t):
            raise Conflict(
                f"template {name!r} is what {', '.join(users)} is built on: remove that first"
            )
        if running := [i.id for i in rt.list() if i.template == name]:
            raise Conflict(
                f"template {name!r} has sandboxes: {', '.join(running)} (kill them first)"
            )
        rt.templates.remove(name)
        rt.warm.remove(name)
        log_path(rt.host, name).unlink(missing_ok=True)
        collected = rt.layers.collect(rt.templates)
        console.print(f"removed template [bold]{name}[/bold] ({collected} unused layers removed)")
    except SandholdError as e:
        fail(e)


@app.command("logs")
def template_logs(
    name: str,
    level: Annotated[
        str | None, typer.Option(help="Only entries of this level (info, warn, error)")
    ] = None,
) -> None:
    """The log of a template's last build (through the CLI or the server)."""
    from rich.text import Text

    from sandhold.runtime.spec import NAME_RE
    from sandhold.runtime.templates.build import log_path

    try:
        rt = runtime()
        path = log_path(rt.host, name)
        if not NAME_RE.match(name) or not path.exists():
            raise TemplateNotFound(f"no build log for template {name!r}")
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                raise InvalidRequest(f"{path}: not a build log (a line is not JSON)") from None
            if level is None or entry.get("level") == level:
                lvl, msg = entry.get("level", ""), entry.get("message", "")
                text = Text(f"{entry.get('timestamp', '')} {lvl}: {msg}")
                console.print(text, style="red" if lvl == "error" else "", soft_wrap=True)
    except SandholdError as e:
        fail(e)
