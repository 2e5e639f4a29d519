"""`sandhold audit`: the file-API, egress and console-actions audit logs, as JSON lines."""

from __future__ import annotations

from typing import Annotated

import typer

from sandhold.cli.common import fail
from sandhold.errors import InvalidRequest, SandholdError


def audit(
    log: Annotated[
        str, typer.Argument(help="files (the E2B file API), egress or console (its actions)")
    ],
    sandbox: Annotated[str | None, typer.Option(help="only this sandbox")] = None,
    session: Annotated[str | None, typer.Option(help="only this session")] = None,
    decision: Annotated[
        str | None,
        typer.Option(
            help="allowed, denied, failed (files); allow, deny (egress); done, refused, failed "
            "(console: its status)"
        ),
    ] = None,
    since: Annotated[float, typer.Option(help="only the last N seconds")] = 86400.0,
    limit: Annotated[int, typer.Option(help="at most N records, the latest")] = 1000,
) -> None:
    """Print an audit log as JSON lines (oldest first)."""
    import json
    import time

    from sandhold import audit as logs
    from sandhold.config import get_settings

    dirs = {"files": logs.files_dir, "egress": logs.egress_dir, "console": logs.console_dir}
    try:
        if log not in dirs:
            raise InvalidRequest(f"unknown audit log {log!r}: use files, egress or console")
        directory = dirs[log](get_settings().data_dir)
        console = log == "console"  # its log says how an action ended as its status
        records = logs.query(
            directory,
            since=time.time() - since,
            limit=limit,
            sandbox=sandbox,
            session=session,
            decision=None if console else decision,
            status=decision if console else None,
        )
    except SandholdError as e:
        fail(e)
    for rec in records:
        print(json.dumps(rec))
