"""`sandhold top`: a live terminal view of what the console shows, from its JSON API.

Against a gateway (``--gateway URL``): usage by tenant and scenario over the last ``--window``
seconds (/console/api/stats), the live sandboxes (/console/api/sandboxes) and the latest
failures (/console/api/failures); against ``sandhold serve`` (``--server URL``): its live
sandboxes. The key (``--key``) is sent as ``Authorization: Bearer``: the admin key sees every
tenant, a tenant's (or a team's) key its own.

Every string that comes from the API (tenants, sessions, scenarios, errors: much of it written
by models or platforms) is shown as plain ``rich.text.Text``, never parsed as markup."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from sandhold.cli.common import console, fail
from sandhold.errors import InvalidRequest, SandholdError, Unauthenticated, Unavailable

FAILURES_SHOWN = 10


class Source:
    """The console API of one gateway or server."""

    def __init__(self, url: str, key: str, kind: str, timeout: float = 10.0) -> None:
        import httpx

        self.kind = kind
        self.url = url.rstrip("/")
        self.client = httpx.Client(
            base_url=self.url,
            timeout=timeout,
            trust_env=False,
            headers={"Authorization": f"Bearer {key}"},
        )

    def post(self, name: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        import httpx

        try:
            r = self.client.post(f"/console/api/{name}", json=body or {})
        except httpx.HTTPError as e:
            raise Unavailable(f"cannot reach {self.url}: {e}") from None
        try:
            data = r.json()
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise Unavailable(f"{self.url}/console/api/{name} answered {r.status_code}, not JSON")
        if r.status_code == 401:
            raise Unauthenticated(str(data.get("message") or "the key was refused"))
        if r.status_code != 200:
            raise InvalidRequest(f"{name}: {data.get('code')}: {data.get('message')}")
        return data

    def close(self) -> None:
        self.client.close()


def _t(value: Any) -> Any:
    """A cell: plain text whatever it contains (markup shown as written)."""
    from rich.text import Text

    if value is None:
        return Text("-", style="dim")
    if isinstance(value, float):
        value = f"{value:g}"
    return Text(str(value))


def _age(seconds: Any) -> str:
    if not isinstance(seconds, int | float):
        return "-"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _sandboxes(rows: list[dict[str, Any]], gateway: bool) -> Any:
    from rich.table import Table

    t = Table(title=f"Live sandboxes ({len(rows)})", title_justify="left", expand=True)
    cols = ["tenant", "session"] if gateway else ["team", "template"]
    for c in (*cols, "sandbox", "state", "age", "cpu %", "memory MiB", "disk MiB"):
        t.add_column(c, overflow="fold")
    for r in rows:
        first = [r.get("tenant"), r.get("session_id") if gateway else r.get("template")]
        t.add_row(
            *map(_t, first),
            _t(r.get("sandbox_id")),
            _t(r.get("state")),
            _t(_age(r.get("age_s"))),
            _t(r.get("cpu_pct")),
            _t(r.get("memory_mib")),
            _t(r.get("disk_mib")),
        )
    return t


def _usage(stats: dict[str, Any], window_s: float) -> Any:
    from rich.table import Table

    t = Table(
        title=f"Usage, last {window_s:g} s, by tenant and scenario",
        title_justify="left",
        expand=True,
    )
    for c in (
        "tenant",
        "scenario",
        "sessions",
        "tool calls",
        "p50 ms",
        "p95 ms",
        "failures",
        "sandbox-h",
    ):
        t.add_column(c, overflow="fold")
    for g in stats.get("groups") or []:
        t.add_row(
            *(
                _t(g.get(k))
                for k in (
                    "tenant",
                    "scenario",
                    "sessions",
                    "tool_calls",
                    "p50_ms",
                    "p95_ms",
                    "failures",
                    "sandbox_hours",
                )
            )
        )
    return t


def _failures(rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    t = Table(title=f"Latest failures ({len(rows)} shown)", title_justify="left", expand=True)
    for c in ("at", "tenant", "session", "scenario", "kind", "tool", "error or reason"):
        t.add_column(c, overflow="fold")
    for f in rows:
        at = f.get("at")
        when = time.strftime("%H:%M:%S", time.localtime(at)) if isinstance(at, int | float) else at
        t.add_row(
            _t(when),
            _t(f.get("tenant_id")),
            _t(f.get("session_id")),
            _t(f.get("scenario")),
            _t(f.get("kind")),
            _t(f.get("tool")),
            _t(f.get("error") or f.get("reason")),
        )
    return t


def frame(src: Source, window_s: float) -> Any:
    """One screen: a header line and the tables."""
    from rich.console import Group
    from rich.text import Text

    header = Text(
        f"sandhold top  {src.kind} {src.url}  {time.strftime('%Y-%m-%d %H:%M:%S')}", style="bold"
    )
    sandboxes = src.post("sandboxes").get("sandboxes") or []
    if src.kind == "server":
        return Group(header, _sandboxes(sandboxes, gateway=False))
    now = time.time()
    span = {"since": now - window_s, "until": now}
    stats = src.post("stats", span)
    failures = src.post("failures", {**span, "limit": FAILURES_SHOWN}).get("failures") or []
    return Group(
        header, _usage(stats, window_s), _sandboxes(sandboxes, gateway=True), _failures(failures)
    )


def top(
    gateway: Annotated[str | None, typer.Option(help="URL of a gateway (its console API)")] = None,
    server: Annotated[str | None, typer.Option(help="URL of a `sandhold serve`")] = None,
    key: Annotated[
        str | None,
        typer.Option(
            help="admin or tenant key (gateway), team API key (server)", envvar="SANDHOLD_TOP_KEY"
        ),
    ] = None,
    interval: Annotated[float, typer.Option(help="seconds between refreshes", min=0.2)] = 2.0,
    window: Annotated[
        float, typer.Option(help="usage and failures of the last N seconds", min=1)
    ] = 3600.0,
    once: Annotated[bool, typer.Option("--once", help="print one frame and exit")] = False,
) -> None:
    """A live view of the console: usage by tenant and scenario, live sandboxes, failures."""
    if (gateway is None) == (server is None):
        fail(InvalidRequest("give one of --gateway URL or --server URL"))
    if not key:
        fail(InvalidRequest("give --key (or SANDHOLD_TOP_KEY)"))
    src = Source(gateway or server or "", key, "gateway" if gateway else "server")
    try:
        if once:
            console.print(frame(src, window))
            return
        from rich.live import Live

        with Live(frame(src, window), console=console, auto_refresh=False, screen=False) as live:
            while True:
                time.sleep(interval)
                live.update(frame(src, window), refresh=True)
    except SandholdError as e:
        fail(e)
    except KeyboardInterrupt:
        pass
    finally:
        src.close()
