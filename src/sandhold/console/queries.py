"""The gateway console's reads of the store: sessions, a session's timeline, failures, and usage
by tenant and scenario over a time range. Each is one or two indexed queries, paged or grouped
in the database, so a page stays fast with 100,000 events (bench/results/history.md, "Console").

A session's scenario is the platform's label (``X-Sandhold-Scenario``, sessions.scenario);
events take their session's. Sandbox-hours count each sandbox span of a session inside the
range: from ``sandbox_created``/``sandbox_adopted``/``sandbox_resumed`` to the next pause,
reclaim, replacement, failure or the session's close (the range's end while it runs).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from sqlalchemy import and_, func, or_, select

from sandhold.store.db import Store
from sandhold.store.models import Event, Session

FAILURE_KINDS = ("failure", "sandbox_failed")
STARTS = ("sandbox_created", "sandbox_adopted", "sandbox_resumed")
STOPS = (
    "sandbox_paused",
    "sandbox_reclaimed",
    "sandbox_replaced",
    "sandbox_failed",
    "sandbox_orphan_killed",
    "session_closed",
)
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
MAX_STATS_EVENTS = 1_000_000  # what one stats query reads at most (beyond: a narrower range)


def _failed() -> Any:
    return or_(
        Event.kind.in_(FAILURE_KINDS), and_(Event.kind == "tool_call", Event.error.is_not(None))
    )


def _scoped(q: Any, tenant: str | None, scenario: str | None) -> Any:
    if tenant is not None:
        q = q.where(Session.tenant_id == tenant)
    if scenario is not None:
        q = q.where(Session.scenario == scenario)
    return q


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
    q = _scoped(q, tenant, scenario).order_by(Session.id.desc()).limit(limit + 1)
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
        "events": [{**{k: getattr(e, k) for k in EVENT_FIELDS}, **_heads(e.texts)} for e in page],
        "next": page[-1].id if len(events) > limit else None,
    }


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


def failures(
    store: Store, tenant: str | None, scenario: str | None, since: float, until: float, limit: int
) -> list[dict[str, Any]]:
    q = _joined(select(Event, Session.scenario)).where(
        _failed(), Event.at >= since, Event.at <= until
    )
    q = _scoped(q, tenant, scenario).order_by(Event.at.desc()).limit(limit)
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
    """Per (tenant, scenario): sessions with events in the range, tool calls, their p50/p95
    latency, failures by class, sandbox-hours."""
    cols = (
        Event.tenant_id,
        Session.scenario,
        Event.session_id,
        Event.kind,
        Event.at,
        Event.duration_ms,
        Event.error,
        Event.sandbox_id,
    )
    q = _joined(select(*cols)).where(Event.at >= since, Event.at <= until)
    q = _scoped(q, tenant, scenario).order_by(Event.at).limit(MAX_STATS_EVENTS)

    def group() -> dict[str, Any]:
        return {
            "sessions": set(),
            "durations": [],
            "failures": defaultdict(int),
            "spans": {},
            "seconds": 0.0,
        }

    groups: dict[tuple[str, str | None], dict[str, Any]] = defaultdict(group)
    n = 0
    with store.db() as db:
        # on the session's Core connection: ORM rows cost a quarter of the time at 100,000
        for t, sc, sess, kind, at, duration, err, sandbox in db.connection().execute(q):
            n += 1
            g = groups[(t, sc)]
            g["sessions"].add(sess)
            if kind == "tool_call":
                if duration is not None:
                    g["durations"].append(duration)
                if err is not None:
                    g["failures"][_error_class(err)] += 1
            elif kind in FAILURE_KINDS:
                g["failures"][kind] += 1
            if kind in STARTS and sandbox:
                g["spans"].setdefault(sess, at)
            elif kind in STOPS and sess in g["spans"]:
                g["seconds"] += at - g["spans"].pop(sess)
    out = []
    for (t, sc), g in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        g["seconds"] += sum(until - start for start in g["spans"].values())  # still running
        d = sorted(g["durations"])
        out.append(
            {
                "tenant": t,
                "scenario": sc,
                "sessions": len(g["sessions"]),
                "tool_calls": len(d),
                "p50_ms": round(statistics.median(d), 2) if d else None,
                "p95_ms": round(d[min(len(d) - 1, round(0.95 * (len(d) - 1)))], 2) if d else None,
                "failures": sum(g["failures"].values()),
                "failure_classes": dict(g["failures"]),
                "sandbox_hours": round(g["seconds"] / 3600, 4),
            }
        )
    return {"since": since, "until": until, "events": n, "groups": out}


def _error_class(error: str) -> str:
    """``code: message`` errors (the gateway's) by code; anything else as one class."""
    head = error.split(":", 1)[0].strip()
    return head if head and len(head) <= 40 and " " not in head else "error"
