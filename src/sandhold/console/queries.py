"""The gateway console's reads of the store: sessions, a session's timeline, failures, and usage
by tenant and scenario over a time range. Each is one or two indexed queries, paged or grouped
in the database, so a page stays fast with 100,000 events (bench/results/history.md, "Console").

A session's scenario is the platform's label (``X-Sandhold-Scenario``, sessions.scenario);
events take their session's. Sandbox-hours count each sandbox span of a session inside the
range: from ``sandbox_created``/``sandbox_adopted``/``sandbox_resumed`` to the next pause,
reclaim, replacement, failure or the session's close (the range's end while it runs), a span
begun before the range included (store/tally.py defines them, and failure classes). Usage over
long ranges reads the hourly rollups (store/rollups.py, console/series.py).
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import and_, func, or_, select

from sandhold.console import series
from sandhold.store.db import Store
from sandhold.store.models import Event, Session
from sandhold.store.rollups import scoped, usage
from sandhold.store.tally import FAILURE_KINDS, Cell, Group, percentile

EVENT_FIELDS = (
    "id",
    "at",
    "kind",
    "sandbox_id",
    "tool",
    "duration_ms",
    "exit_code",
    "error",
    "reason",
)
TEXTS = ("input", "stdout", "stderr")  # what a tool call's event keeps (gateway/texts.py)
HEAD = 4096  # characters of each a timeline row shows
ONE_BUCKET = 1e12  # s: a bucket longer than any range (stats: one per group)


def _failed() -> Any:
    return or_(
        Event.kind.in_(FAILURE_KINDS), and_(Event.kind == "tool_call", Event.error.is_not(None))
    )


def _joined(q: Any) -> Any:
    return q.join(
        Session, and_(Session.tenant_id == Event.tenant_id, Session.session_id == Event.session_id)
    )


def sessions(
    store: Store,
    tenant: str | None,
    scenario: str | None,
    since: float,
    until: float,
    cursor: int | None,
    limit: int,
) -> dict[str, Any]:
    """Sessions active in the range (opened before its end, not closed before its start),
    newest first, with their tool calls, failures and last event."""
    open_then = or_(Session.closed_at.is_(None), Session.closed_at >= since)
    q = select(Session).where(Session.created_at <= until, open_then)
    q = scoped(q, tenant, scenario).order_by(Session.id.desc()).limit(limit + 1)
    if cursor is not None:
        q = q.where(Session.id < cursor)
    with store.db() as db:
        rows = list(db.scalars(q))[: limit + 1]
        page = rows[:limit]
        counts: dict[tuple[str, str], tuple[int, int, float | None]] = {}
        if page:
            keys = [(s.tenant_id, s.session_id) for s in page]
            agg = db.execute(
                select(
                    Event.tenant_id,
                    Event.session_id,
                    func.count().filter(Event.kind == "tool_call"),
                    func.count().filter(_failed()),
                    func.max(Event.at),
                )
                .where(or_(*(and_(Event.tenant_id == t, Event.session_id == s) for t, s in keys)))
                .group_by(Event.tenant_id, Event.session_id)
            )
            counts = {(t, s): (int(c), int(f), last) for t, s, c, f, last in agg}
    out = []
    for s in page:
        calls, fails, last = counts.get((s.tenant_id, s.session_id), (0, 0, None))
        out.append(
            {
                "tenant_id": s.tenant_id,
                "session_id": s.session_id,
                "scenario": s.scenario,
                "state": s.state,
                "sandbox_id": s.sandbox_id,
                "created_at": s.created_at,
                "last_at": last,
                "tool_calls": calls,
                "failures": fails,
            }
        )
    return {"sessions": out, "next": page[-1].id if len(rows) > limit else None}


def timeline(
    store: Store, tenant: str, session: str, before: int | None, limit: int
) -> dict[str, Any] | None:
    """A page of a session's events, newest first (None: no such session of that tenant)."""
    with store.db() as db:
        row = db.scalar(
            select(Session).where(Session.tenant_id == tenant, Session.session_id == session)
        )
        if row is None:
            return None
        q = select(Event).where(Event.tenant_id == tenant, Event.session_id == session)
        if before is not None:
            q = q.where(Event.id < before)
        events = list(db.scalars(q.order_by(Event.id.desc()).limit(limit + 1)))
    page = events[:limit]
    return {
        "session": {
            "tenant_id": row.tenant_id,
            "session_id": row.session_id,
            "scenario": row.scenario,
            "state": row.state,
        },
        "events": [_with_heads(e) for e in page],
        "next": page[-1].id if len(events) > limit else None,
    }


def _with_heads(e: Event) -> dict[str, Any]:
    return {**{k: getattr(e, k) for k in EVENT_FIELDS}, **_heads(e.texts)}


def _heads(texts: dict[str, Any] | None) -> dict[str, Any]:
    """A tool call's input and output as a timeline row shows them: the first HEAD characters
    of each, and the full size of each that is longer (kept, or cut when it was recorded)."""
    if not texts:
        return {}
    cut = texts.get("cut") or {}
    heads: dict[str, str] = {}
    sizes: dict[str, int] = {}
    for name in TEXTS:
        value = texts.get(name)
        if not isinstance(value, str):
            continue
        heads[name] = value[:HEAD]
        if len(value) > HEAD or name in cut:
            sizes[name] = int(cut.get(name) or len(value.encode()))
    return {"texts": heads, "sizes": sizes}


def text(store: Store, tenant: str, session: str, event: int, name: str) -> dict[str, Any] | None:
    """One kept text of a session's event, whole (None: no such event of that session)."""
    with store.db() as db:
        texts = db.scalar(
            select(Event.texts).where(
                Event.id == event, Event.tenant_id == tenant, Event.session_id == session
            )
        )
    if texts is None or not isinstance(texts.get(name), str):
        return None
    cut = (texts.get("cut") or {}).get(name)
    return {"text": texts[name], "cut_from_bytes": cut}


def sandbox_events(
    store: Store, tenant: str, session: str, sandbox_id: str, limit: int = 200
) -> list[dict[str, Any]]:
    """A session's newest events about one of its sandboxes (a sandbox's page)."""
    q = select(Event).where(
        Event.tenant_id == tenant, Event.session_id == session, Event.sandbox_id == sandbox_id
    )
    with store.db() as db:
        rows = db.scalars(q.order_by(Event.id.desc()).limit(limit))
        return [_with_heads(e) for e in rows]


def failures(
    store: Store, tenant: str | None, scenario: str | None, since: float, until: float, limit: int
) -> list[dict[str, Any]]:
    q = _joined(select(Event, Session.scenario)).where(
        _failed(), Event.at >= since, Event.at <= until
    )
    q = scoped(q, tenant, scenario).order_by(Event.at.desc()).limit(limit)
    with store.db() as db:
        rows = list(db.execute(q))
    return [
        {
            "tenant_id": e.tenant_id,
            "session_id": e.session_id,
            "scenario": sc,
            **{k: getattr(e, k) for k in EVENT_FIELDS},
        }
        for e, sc in rows
    ]


def stats(
    store: Store, tenant: str | None, scenario: str | None, since: float, until: float
) -> dict[str, Any]:
    """Per (tenant, scenario): sessions active in the range (as ``sessions`` counts them), tool
    calls, their p50/p95 latency (within 2%: series.py), failures by class, sandbox-hours; and
    the range's events in all. Whole rolled-up hours and days come from the rollups, the rest
    from raw events (store/rollups.py); nothing is counted after now."""
    hi = min(until, time.time())
    cells: dict[Group, Cell] = {}
    if hi >= since:
        tally = usage(store.engine, since, ONE_BUCKET, 1, hi, tenant, scenario, days=True)
        cells = {g: row[0] for g, row in tally.cells.items() if row[0]}
    counts: dict[Group, int] = {}
    if hi >= since:
        open_then = or_(Session.closed_at.is_(None), Session.closed_at >= since)
        q = select(Session.tenant_id, Session.scenario, func.count()).where(
            Session.created_at <= hi, open_then
        )
        q = scoped(q, tenant, scenario).group_by(Session.tenant_id, Session.scenario)
        with store.db() as db:
            counts = {(t, sc): int(n) for t, sc, n in db.execute(q)}
    out = []
    for g in series.ordered(set(cells) | set(counts)):
        c = cells.get(g) or Cell()
        out.append(
            {
                "tenant": g[0],
                "scenario": g[1],
                "sessions": counts.get(g, 0),
                "tool_calls": c.tool_calls,
                "p50_ms": percentile(c.latency, 0.5),
                "p95_ms": percentile(c.latency, 0.95),
                "failures": sum(c.failures.values()),
                "failure_classes": dict(c.failures),
                "sandbox_hours": round(c.running_s / 3600, 4),
            }
        )
    events = sum(c.events for c in cells.values())
    return {"since": since, "until": until, "events": events, "groups": out}
