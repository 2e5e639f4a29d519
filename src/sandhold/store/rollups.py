"""The timeline rolled up per hour, and the reads that combine rollups with raw events.

The job (``roll_up``): every replica runs it (gateway/app.py, every ``gateway_rollup_interval_s``);
it tallies whole hours that ended more than ``lag_s`` ago (events commit a little after their
``at``), one hour per transaction, oldest first, from the hour of the oldest event on a fresh
store. Each hour's transaction first moves the watermark (``event_rollup_mark``) with a
compare-and-swap from the hour it read, then writes the hour's rows (and, at a UTC day's end, the
day's rows summed from its hours): a replica whose swap finds another hour there wrote nothing
and reads the mark again. On PostgreSQL the swap's row lock makes a second replica wait for the
first's commit and then find its swap stale; on SQLite the swap takes the database's write lock.
The mark also keeps the newest event id a roll had seen: an event written later into an hour
already rolled up (a stop recorded long after it happened, a gateway back from hours away)
moves the mark back to before that hour, and the hours from it on are rolled up again (each
hour's rows are replaced). Ids are taken as the order events became visible in, which holds
but for an insert that commits after a later one's roll began, with its ``at`` past the lag.
Deleting the mark row rolls everything up again from the oldest event.

Every hour is tallied alike, rolled up or read raw: the sessions' sandbox states at its start
(each active session's last start or stop before it, through the partial index
``ix_events_lifecycle``), then its events in order (tally.py). So a range read from rollups gives
what the same range read from raw events gives.

``usage`` fills a ``Tally`` over bucket edges for a range: whole rolled-up days or hours from
rollups (days only where buckets hold whole days), the rest (sub-hour buckets, the range's
partial first hour, the hours not rolled up yet) from raw events.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any, cast

from sqlalchemy import (
    Connection,
    Engine,
    Table,
    and_,
    case,
    delete,
    func,
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from sandhold.store.models import LIFECYCLE_SQL, Event, EventRollup, EventRollupMark, Session
from sandhold.store.tally import (
    DAY,
    HOUR,
    LOG_GAMMA,
    MIN_MS,
    PAUSE,
    STARTS,
    Cell,
    Group,
    Tally,
)

R = cast(Table, EventRollup.__table__)
MARK = 1  # the mark row's id
HEAD_CHARS = 200  # of an error's text before its first colon (a class has at most 40)
READ_COLUMNS = tuple(
    R.c[name]
    for name in (
        "tenant_id",
        "scenario",
        "start_at",
        "events",
        "tool_calls",
        "failure_classes",
        "latency",
        "running_s",
        "paused_s",
    )
)


def floor_to(t: float, step: int) -> int:
    return int(math.floor(t / step) * step)


def ceil_to(t: float, step: int) -> int:
    return int(math.ceil(t / step) * step)


def scoped(q: Any, tenant: str | None, scenario: str | None) -> Any:
    """``q`` (joined with the sessions) kept to a tenant and a scenario (None: any)."""
    if tenant is not None:
        q = q.where(Session.tenant_id == tenant)
    if scenario is not None:
        q = q.where(Session.scenario == scenario)
    return q


def states_at(
    conn: Connection, at: float, tenant: str | None = None, scenario: str | None = None
) -> Iterator[tuple[str, str, str | None, bool]]:
    """(tenant, session, scenario, paused?) of each session active at ``at`` whose sandbox was
    running or paused then, from its last start or stop before ``at``."""
    last = (
        select(Event.kind)
        .where(
            Event.tenant_id == Session.tenant_id,
            Event.session_id == Session.session_id,
            text(LIFECYCLE_SQL),  # as the partial index reads, literally
            Event.at < at,
            or_(Event.sandbox_id.is_not(None), Event.kind.not_in(STARTS)),
        )
        .order_by(Event.at.desc(), Event.id.desc())
        .limit(1)
        .scalar_subquery()
    )
    q = select(Session.tenant_id, Session.session_id, Session.scenario, last).where(
        Session.created_at <= at, or_(Session.closed_at.is_(None), Session.closed_at >= at)
    )
    for t, s, sc, kind in conn.execute(scoped(q, tenant, scenario)):
        if kind in STARTS or kind == PAUSE:
            yield t, s, sc, kind == PAUSE


def _counts(
    conn: Connection,
    tally: Tally,
    lo: float,
    hi: float,
    closed: bool,
    tenant: str | None,
    scenario: str | None,
) -> None:
    """Events of [lo, hi) counted in the database by group, bucket, kind, latency key and
    error head: what a tally needs of them but their order (a row per event read into Python
    cost 3 us each, most of a busy hour's read)."""
    tool = Event.kind == "tool_call"
    ms = case((Event.duration_ms < MIN_MS, MIN_MS), else_=Event.duration_ms)
    key = case((and_(tool, Event.duration_ms.is_not(None)), func.floor(func.ln(ms) / LOG_GAMMA)))
    colon = (func.instr if conn.dialect.name == "sqlite" else func.strpos)(Event.error, ":")
    head = func.substr(Event.error, 1, case((colon > 0, colon - 1), else_=HEAD_CHARS))
    q = (
        select(
            Event.tenant_id,
            Session.scenario,
            func.floor((Event.at - tally.origin) / tally.step),
            Event.kind,
            key,
            case((and_(tool, Event.error.is_not(None)), func.substr(head, 1, HEAD_CHARS))),
            func.count(),
        )
        .join(
            Session,
            (Session.tenant_id == Event.tenant_id) & (Session.session_id == Event.session_id),
        )
        .where(Event.at >= lo, Event.at <= hi if closed else Event.at < hi)
        .group_by(*(text(str(i)) for i in range(1, 7)))  # (the bound parameters differ)
    )
    for t, sc, i, kind, k, h, n in conn.execute(scoped(q, tenant, scenario)):
        tally.count((t, sc), int(i), kind, None if k is None else int(k), h, int(n))


def _lifecycle(
    conn: Connection, lo: float, hi: float, closed: bool, tenant: str | None, scenario: str | None
) -> Any:
    q = (
        select(
            Event.tenant_id,
            Session.scenario,
            Event.session_id,
            Event.kind,
            Event.at,
            Event.sandbox_id,
        )
        .join(
            Session,
            (Session.tenant_id == Event.tenant_id) & (Session.session_id == Event.session_id),
        )
        .where(text(LIFECYCLE_SQL), Event.at >= lo, Event.at <= hi if closed else Event.at < hi)
        .order_by(Event.at, Event.id)
    )
    return conn.execute(scoped(q, tenant, scenario))


def tally_raw(
    conn: Connection,
    tally: Tally,
    lo: float,
    hi: float,
    *,
    closed: bool = False,
    tenant: str | None = None,
    scenario: str | None = None,
) -> None:
    """Raw events of [lo, hi) ([lo, hi] if ``closed``) into ``tally``, an hour at a time: each
    hour (or the range's part of it) from the sandbox states at its start."""
    a = lo
    while a < hi or (closed and a == hi):
        b = min(floor_to(a, HOUR) + HOUR, hi)
        last = closed and b == hi
        _counts(conn, tally, a, b, last, tenant, scenario)
        tally.begin(a, states_at(conn, a, tenant, scenario))
        for row in _lifecycle(conn, a, b, last, tenant, scenario):
            tally.event(*row)
        tally.end(b)
        if b == hi:
            break
        a = b


def _none_before(conn: Connection, at: float) -> bool:
    """No event before ``at`` (then nothing before the first rolled-up hour needs reading)."""
    oldest = conn.execute(select(func.min(Event.at))).scalar()
    return oldest is None or oldest >= at


# -- the job --------------------------------------------------------------------------------------
def mark(conn: Connection) -> tuple[int, int] | None:
    """(first, last) hours rolled up; None before the first run."""
    row = conn.execute(
        select(EventRollupMark.first_hour, EventRollupMark.last_hour).where(
            EventRollupMark.id == MARK
        )
    ).first()
    return None if row is None else (int(row[0]), int(row[1]))


def roll_up(engine: Engine, lag_s: float, now: float | None = None, max_hours: int = 24) -> int:
    """Roll up to ``max_hours`` whole hours that ended ``lag_s`` ago or earlier; returns how
    many it rolled up (0: caught up, or nothing to roll up yet)."""
    now = time.time() if now is None else now
    done = 0
    while done < max_hours:
        with engine.connect() as conn:
            at = mark(conn)
            if at is None:
                oldest = conn.execute(select(func.min(Event.at))).scalar()
                conn.rollback()
                if oldest is None:
                    return done
                _start(engine, floor_to(oldest, HOUR), now)
                continue
            seen = _seen(conn)
            newest = int(conn.execute(select(func.max(Event.id))).scalar() or 0)
            late = _late(conn, at, seen)
            if late is not None:  # an hour rolled up has a new event: from it on, again
                conn.rollback()
                back = max(at[0], floor_to(late, HOUR)) - HOUR
                with engine.begin() as c:
                    _swap(c, at[1], seen, back, newest, now)  # (lost: another moved it)
                continue
            hour = at[1] + HOUR
            if hour + HOUR + lag_s > now:
                return done
            tally = Tally(hour, HOUR)
            tally_raw(conn, tally, hour, hour + HOUR)
            upto = hour if tally.cells else _skip(conn, hour, now, lag_s)
            conn.rollback()
        with engine.begin() as conn:
            if not _swap(conn, at[1], seen, upto, max(seen, newest), now):
                continue  # another replica moved the mark first: read it again
            _write(conn, hour, tally.cells, upto=upto)
            if (upto + HOUR) % DAY == 0:
                _write_day(conn, upto + HOUR - DAY)
        done += 1
    return done


def _seen(conn: Connection) -> int:
    seen = conn.execute(
        select(EventRollupMark.seen_event_id).where(EventRollupMark.id == MARK)
    ).scalar()
    return int(seen or 0)


def _late(conn: Connection, at: tuple[int, int], seen: int) -> float | None:
    """The time of the oldest event written into a rolled-up hour after its roll (None: none);
    only the events newer than ``seen`` are looked at (the primary key's range)."""
    # by the primary key's range, not the index on at (whose range is every hour rolled up):
    # ordered by id in a subquery, which SQLite's planner then walks by rowid
    new = select(Event.at).where(Event.id > seen).order_by(Event.id).limit(2**62).subquery()
    late = conn.execute(
        select(func.min(new.c.at)).where(new.c.at >= at[0], new.c.at < at[1] + HOUR)
    ).scalar()
    return None if late is None else float(late)


def _start(engine: Engine, first: int, now: float) -> None:
    """The mark before the first hour; a replica starting at the same moment may insert it
    first (then its row stands: a duplicate key changes nothing)."""
    row = {
        "id": MARK,
        "first_hour": first,
        "last_hour": first - HOUR,
        "seen_event_id": 0,
        "updated_at": now,
    }
    dialect_insert = sqlite_insert if engine.dialect.name == "sqlite" else pg_insert
    with engine.begin() as conn:
        conn.execute(dialect_insert(EventRollupMark).values(row).on_conflict_do_nothing())


def _skip(conn: Connection, hour: int, now: float, lag_s: float) -> int:
    """An hour with no event and no sandbox: the last hour before the next event that may be
    passed over at once (never past its UTC day's end, so that every day gets its rows)."""
    nxt = conn.execute(select(func.min(Event.at)).where(Event.at >= hour + HOUR)).scalar()
    ready = floor_to(now - lag_s, HOUR) - HOUR  # the last hour that ended lag_s ago
    before = floor_to(nxt, HOUR) - HOUR if nxt is not None else ready
    return max(hour, min(before, ready, floor_to(hour, DAY) + DAY - HOUR))


def _swap(conn: Connection, last: int, seen: int, upto: int, newest: int, now: float) -> bool:
    """Move the mark from what was read to ``upto``; False when another replica moved it
    first (its transaction then commits nothing: it wrote nothing else)."""
    # first statement of the transaction: SQLite takes its write lock here (engine.py). Both
    # fields are compared: after a move back and a roll forward to the same hour, the seen id
    # has grown, so a replica that read the mark before either still finds its swap stale.
    res = conn.execute(
        update(EventRollupMark)
        .where(
            EventRollupMark.id == MARK,
            EventRollupMark.last_hour == last,
            EventRollupMark.seen_event_id == seen,
        )
        .values(last_hour=upto, seen_event_id=newest, updated_at=now)
    )
    return bool(res.rowcount == 1)


def _rows(span: int, start: int, cells: dict[Group, list[Cell]]) -> list[dict[str, Any]]:
    out = []
    for (tenant, scenario), (c, *_) in cells.items():
        if not c:
            continue
        out.append(
            {
                "span_s": span,
                "start_at": start,
                "tenant_id": tenant,
                "scenario": scenario or "",
                "events": c.events,
                "tool_calls": c.tool_calls,
                "failures": sum(c.failures.values()),
                "failure_classes": c.failures,
                "latency": c.latency,
                "running_s": c.running_s,
                "paused_s": c.paused_s,
            }
        )
    return out


def _write(
    conn: Connection,
    start: int,
    cells: dict[Group, list[Cell]],
    span: int = HOUR,
    upto: int | None = None,
) -> None:
    """The rows of ``start``'s hour (or day), replacing what an earlier run (its mark since
    deleted) left there and in the hours passed over up to ``upto``."""
    last = start if upto is None else upto
    conn.execute(delete(R).where(R.c.span_s == span, R.c.start_at >= start, R.c.start_at <= last))
    rows = _rows(span, start, cells)
    if rows:
        conn.execute(insert(R), rows)


def _write_day(conn: Connection, day: int) -> None:
    tally = Tally(day, DAY)
    for group, start, cell in _read(conn, HOUR, day, day + DAY, None, None):
        tally.add(group, start, cell)
    _write(conn, day, tally.cells, DAY)


# -- reads ----------------------------------------------------------------------------------------
def _read(
    conn: Connection, span: int, lo: int, hi: int, tenant: str | None, scenario: str | None
) -> Iterator[tuple[Group, int, Cell]]:
    """Rollup rows of ``span`` starting in [lo, hi)."""
    if lo >= hi:
        return
    q = select(*READ_COLUMNS).where(R.c.span_s == span, R.c.start_at >= lo, R.c.start_at < hi)
    if tenant is not None:
        q = q.where(R.c.tenant_id == tenant)
    if scenario is not None:
        q = q.where(R.c.scenario == scenario)
    for t, sc, start, events, calls, classes, latency, run_s, pause_s in conn.execute(q):
        cell = Cell(events, calls, classes, latency, run_s, pause_s)
        yield (t, sc or None), int(start), cell


def usage(
    engine: Engine,
    origin: float,
    step: float,
    n: int,
    hi: float,
    tenant: str | None,
    scenario: str | None,
    *,
    days: bool,
    closed: bool = True,
) -> Tally:
    """The cells of ``n`` buckets of ``step`` from ``origin`` over [origin, hi] (``closed``: an
    event at ``hi`` counts). Rollups serve whole rolled-up hours when every bucket edge is an
    hour's start, whole days too with ``days`` (no bucket edge inside a day)."""
    lo = origin
    tally = Tally(origin, step, n)
    with engine.connect() as conn:
        at = mark(conn)
        hourly = n == 1 or (origin % HOUR == 0 and step % HOUR == 0)
        r0, r1 = ceil_to(lo, HOUR), floor_to(hi, HOUR)
        if at is not None and hourly:
            r0, r1 = max(r0, at[0]), min(r1, at[1] + HOUR)
        if at is None or not hourly or r0 >= r1:
            tally_raw(conn, tally, lo, hi, closed=closed, tenant=tenant, scenario=scenario)
            return tally
        d0, d1 = (ceil_to(r0, DAY), floor_to(r1, DAY)) if days else (r1, r1)
        if d0 >= d1:
            d0 = d1 = r1
        for span, a, b in ((DAY, d0, d1), (HOUR, r0, d0), (HOUR, d1, r1)):
            for group, start, cell in _read(conn, span, a, b, tenant, scenario):
                tally.add(group, start, cell)
        if lo < r0 and not (r0 == at[0] and _none_before(conn, r0)):
            tally_raw(conn, tally, lo, r0, tenant=tenant, scenario=scenario)
        tally_raw(conn, tally, r1, hi, closed=closed, tenant=tenant, scenario=scenario)
    return tally
