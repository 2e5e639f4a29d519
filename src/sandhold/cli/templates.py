"""`sandhold template`: the template root filesystems of this host."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sandhold.cli.common import console, fail, runtime
from sandhold.errors import SandholdError

app = typer.Typer(no_args_is_help=True, help="Template root filesystems.")


@app.command("ls")
def template_ls() -> None:
    """List templates (building `base` on first use)."""
    from rich.table import Table

    try:
        rt = runtime()
        rt.templates.get("base")
        table = Table("name", "kind", "user", "workdir", "rootfs")
        for t in rt.templates.list():
            table.add_row(t.name, t.kind, t.user, t.workdir, str(t.rootfs))
        console.print(table)
    except SandholdError as e:
        fail(e)


@app.command("build")
def template_build(
    name: str,
    debootstrap: Annotated[str | None, typer.Option(help="Debian suite, e.g. bookworm")] = None,
    rootfs: Annotated[
        Path | None, typer.Option(help="Import this root filesystem directory")
    ] = None,
    mirror: Annotated[
        str | None, typer.Option(help="Debian archive URI (default: this machine's apt sources')")
    ] = None,
) -> None:
    """Build a template: a shipped one (`base`, `code-interpreter-v1`), from debootstrap, or
    from a root filesystem directory."""
    from sandhold.runtime.templates import BUILTIN_TEMPLATES

    try:
        rt = runtime()
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
        fail(e)
