"""`sandhold audit`: the file-API and egress audit logs, as JSON lines."""

from __future__ import annotations

from typing import Annotated

import typer

from sandhold.cli.common import fail
from sandhold.errors import InvalidRequest, SandholdError


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
    import json
    import time

    from sandhold import audit as logs
    from sandhold.config import get_settings

    dirs = {"files": logs.files_dir, "egress": logs.egress_dir}
    try:
        if log not in dirs:
            raise InvalidRequest(f"unknown audit log {log!r}: use files or egress")
        directory = dirs[log](get_settings().data_dir)
        records = logs.query(
            directory,
            since=time.time() - since,
            limit=limit,
            sandbox=sandbox,
            session=session,
            decision=decision,
        )
    except SandholdError as e:
        fail(e)
    for rec in records:
        print(json.dumps(rec))
