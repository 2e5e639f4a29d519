"""`sandhold logs`: read and filter the JSON-lines logs of `sandhold serve` and `sandhold gateway
serve` (log_dir, default data_dir/logs; sandhold.logs)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from sandhold.cli.common import console, err, fail, load_settings
from sandhold.errors import InvalidRequest, SandholdError

if TYPE_CHECKING:
    from sandhold.logs.read import Entry, Filter

IDS = ("request_id", "tenant", "session", "sandbox")
STYLES = {"DEBUG": "dim", "INFO": "", "WARNING": "yellow", "ERROR": "red", "CRITICAL": "bold red"}


def logs(
    component: Annotated[
        list[str] | None, typer.Option(help="server, gateway (repeatable; default: all)")
    ] = None,
    level: Annotated[str | None, typer.Option(help="this level and above (WARNING, ...)")] = None,
    request: Annotated[str | None, typer.Option(help="only this request id")] = None,
    tenant: Annotated[str | None, typer.Option(help="only this tenant (team)")] = None,
    session: Annotated[str | None, typer.Option(help="only this session")] = None,
    sandbox: Annotated[str | None, typer.Option(help="only this sandbox")] = None,
    since: Annotated[
        str | None, typer.Option(help="from this time: ISO 8601 (UTC unless it says) or 10m, 2h")
    ] = None,
    until: Annotated[str | None, typer.Option(help="up to this time (same forms)")] = None,
    grep: Annotated[str | None, typer.Option(help="only lines containing this text")] = None,
    limit: Annotated[
        int | None, typer.Option(help="the last N matching lines (default: all; 10 with -f)")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="go on printing new lines")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="the lines as written")] = False,
    log_dir: Annotated[
        Path | None, typer.Option("--dir", help="the log directory (default: log_dir)")
    ] = None,
) -> None:
    """Print the structured logs (oldest first), merged across components and rotated files: a
    table on a terminal, one line per record otherwise, the JSON lines with --json."""
    from collections import deque

    from sandhold.logs import read as r

    try:
        directory = log_dir or load_settings().log_path
        flt = _filter(level, request, tenant, session, sandbox, since, until, grep)
        names = component or r.components(directory)
        unknown = [n for n in names if not (directory / f"{n}{r.SUFFIX}").exists()]
        if component and unknown:
            raise InvalidRequest(f"no log of component {unknown[0]!r} in {directory}")
    except SandholdError as e:
        fail(e)
    lines = r.Lines()
    tails = {n: r.Tail(directory / f"{n}{r.SUFFIX}") for n in names} if follow else None
    if limit is None and follow:
        limit = 10
    found: deque[Entry] = deque(r.read(directory, names, flt, lines, tails), maxlen=limit)
    if limit == 0:
        found.clear()
    try:
        if follow:
            assert tails is not None
            for entry in found:
                _print_line(entry, as_json)
            for entry in r.follow(directory, tails, flt, lines, new_components=not component):
                _print_line(entry, as_json)
        elif as_json or not console.is_terminal:  # a table is for a person; a pipe gets lines
            for entry in found:
                _print_line(entry, as_json)
        else:
            _print_table(found)
    except KeyboardInterrupt:
        pass
    finally:
        if lines.skipped:
            err.print(f"[yellow]{lines.skipped} malformed line(s) skipped[/yellow]")


def _filter(
    level: str | None,
    request: str | None,
    tenant: str | None,
    session: str | None,
    sandbox: str | None,
    since: str | None,
    until: str | None,
    grep: str | None,
) -> Filter:
    from sandhold.logs import read as r

    min_level = 0
    if level is not None:
        if level.upper() not in r.LEVELS:
            raise InvalidRequest(f"unknown level {level!r}: use one of {', '.join(r.LEVELS)}")
        min_level = r.LEVELS[level.upper()]
    try:
        since_ts = r.parse_time(since) if since is not None else None
        until_ts = r.parse_time(until) if until is not None else None
    except ValueError as e:
        raise InvalidRequest(str(e)) from None
    return r.Filter(min_level, request, tenant, session, sandbox, since_ts, until_ts, grep)


def _ids(rec: dict[str, object]) -> str:
    return " ".join(f"{k.removesuffix('_id')}={rec[k]}" for k in IDS if rec.get(k) is not None)


def _print_line(entry: Entry, as_json: bool) -> None:
    from rich.markup import escape

    rec, line = entry
    if as_json:
        print(line, flush=True)
        return
    style = STYLES.get(str(rec.get("level")), "")
    text = (
        f"{rec['ts']} {rec.get('level', '?'):<7} {rec.get('logger', '')}: "
        f"{rec.get('message', '')} {_ids(rec)}"
    )
    if rec.get("exc"):
        text += f"\n{rec['exc']}"
    console.print(
        f"[{style}]{escape(text)}[/{style}]" if style else escape(text),
        highlight=False,
        soft_wrap=True,
    )


def _print_table(entries: Iterable[Entry]) -> None:
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False)
    table.add_column("time (UTC)", no_wrap=True, min_width=24)
    table.add_column("level", no_wrap=True)
    for name in ("logger", "message", "ids"):
        table.add_column(name, overflow="fold", ratio=3 if name == "message" else 1)
    for rec, _ in entries:
        message = str(rec.get("message", ""))
        if rec.get("exc"):
            message += f"\n{rec['exc']}"
        style = STYLES.get(str(rec.get("level")), "")
        table.add_row(
            str(rec["ts"]),
            Text(str(rec.get("level", "?")), style=style),
            str(rec.get("logger", "")),
            Text(message, style=style),
            _ids(rec),
        )
    console.print(table)
