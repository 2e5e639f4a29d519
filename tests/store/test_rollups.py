"""The timeline's hourly rollups (store/rollups.py) on SQLite and a real PostgreSQL: a known
timeline (spans across hour edges, a sandbox running since before the range, paused spans,
failures of several classes, durations of known percentiles) gives, per bucket, the counts and
sandbox seconds worked out here by hand; ``series`` and ``stats`` read from rollups equal the same
read from raw events; replicas racing roll each hour once; an hour waits for its lag, and an event
committed before then is in its rollup; an event written into an hour already rolled up rolls
that hour and the later ones up again."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import pytest
from sqlalchemy import delete, func, insert, select

from sandhold.console import queries, series
from sandhold.store import rollups
from sandhold.store.db import Store
from sandhold.store.models import LIFECYCLE_SQL, Event, EventRollup, EventRollupMark, Session
from sandhold.store.tally import DAY, GAMMA, HOUR, LIFECYCLE, error_class

T0 = float(math.floor(time.time() / DAY) * DAY - 3 * DAY)  # a UTC midnight, three days ago
LAG = 300.0
M = 60.0

# (tenant, session, scenario, created_at, closed_at)
SESSIONS = [
    ("acme", "a", "grading", T0 - 2 * HOUR, T0 + 5 * HOUR + 20 * M),
    ("acme", "b", "tutoring", T0 + 40 * M, None),
    ("globex", "c", None, T0 + HOUR, T0 + 6 * HOUR),
    ("acme", "d", "grading", T0 - 10 * HOUR, T0 - 9 * HOUR),
    ("acme", "e", "tutoring", T0 + 3 * HOUR, None),
]
GROUP = {"a": ("acme", "grading"), "b": ("acme", "tutoring"), "c": ("globex", None),
         "d": ("acme", "grading"), "e": ("acme", "tutoring")}  # fmt: skip


def b_error(k: int) -> str | None:
    if k % 5 == 0:
        return "command_timeout: the command ran past its timeout of 60 s"
    if k % 7 == 1:
        return "not_found: no such file: out.md"
    return "something broke" if k == 3 else None


def timeline() -> list[dict[str, Any]]:
    ev: list[dict[str, Any]] = []

    def add(session: str, kind: str, at: float, **more: Any) -> None:
        tenant = GROUP[session][0]
        ev.append({"tenant_id": tenant, "session_id": session, "kind": kind, "at": at, **more})

    add("a", "sandbox_created", T0 - 90 * M, sandbox_id="a1")
    for i in range(100):  # 1..100 ms: 50 in hour 0, 50 in hour 1
        add("a", "tool_call", T0 + 10 * M + i * M, sandbox_id="a1", tool="run_command",
            duration_ms=float(i + 1))  # fmt: skip
    add("a", "sandbox_paused", T0 + 2 * HOUR + 30 * M, sandbox_id="a1")
    add("a", "sandbox_resumed", T0 + 3 * HOUR + 10 * M, sandbox_id="a1")
    add("a", "sandbox_paused", T0 + 4 * HOUR, sandbox_id="a1")
    add("a", "sandbox_paused", T0 + 4 * HOUR + 5 * M, sandbox_id="a1")  # paused already
    add("a", "session_closed", T0 + 5 * HOUR + 20 * M)
    add("b", "sandbox_created", T0 + 45 * M, sandbox_id="b1")
    for k in range(20):  # 10 in hour 0, 10 in hour 1
        add("b", "tool_call", T0 + 50 * M + k * M, sandbox_id="b1", tool="read_file",
            duration_ms=10.0 * (k + 1), error=b_error(k))  # fmt: skip
    add("b", "sandbox_failed", T0 + HOUR + 50 * M, sandbox_id="b1", reason="agent gone")
    add("b", "sandbox_created", T0 + 2 * HOUR + 5 * M, sandbox_id="b2")
    add("b", "sandbox_created", T0 + 2 * HOUR + 6 * M, sandbox_id="b2")  # running already
    add("b", "sandbox_paused", T0 + 4 * HOUR, sandbox_id="b2")  # and paused from then on
    add("c", "sandbox_adopted", T0 + HOUR + M, sandbox_id="c1")
    add("c", "failure", T0 + HOUR + 30 * M, error="provider_error: no answer")
    add("c", "tool_call", T0 + 3 * HOUR, sandbox_id="c1", tool="run_code", duration_ms=5.0)
    add("c", "sandbox_reclaimed", T0 + 5 * HOUR, sandbox_id="c1")
    add("c", "session_closed", T0 + 6 * HOUR)
    add("d", "sandbox_created", T0 - 9.5 * HOUR, sandbox_id="d1")
    add("d", "session_closed", T0 - 9 * HOUR)
    add("e", "sandbox_resumed", T0 + 3.5 * HOUR)  # no sandbox named: no span
    return ev


# The spans the timeline above makes, by hand: (session, paused?, start, end or None: open).
SPANS = [
    ("a", False, T0 - 90 * M, T0 + 2 * HOUR + 30 * M),
    ("a", True, T0 + 2 * HOUR + 30 * M, T0 + 3 * HOUR + 10 * M),
    ("a", False, T0 + 3 * HOUR + 10 * M, T0 + 4 * HOUR),
    ("a", True, T0 + 4 * HOUR, T0 + 5 * HOUR + 20 * M),
    ("b", False, T0 + 45 * M, T0 + HOUR + 50 * M),
    ("b", False, T0 + 2 * HOUR + 5 * M, T0 + 4 * HOUR),
    ("b", True, T0 + 4 * HOUR, None),
    ("c", False, T0 + HOUR + M, T0 + 5 * HOUR),
    ("d", False, T0 - 9.5 * HOUR, T0 - 9 * HOUR),
]


def expected_seconds(group: tuple[str, str | None], paused: bool, a: float, b: float) -> float:
    out = 0.0
    for s, p, start, end in SPANS:
        if GROUP[s] == group and p == paused:
            out += max(0.0, min(b, end if end is not None else b) - max(a, start))
    return out


def failure_class(e: dict[str, Any]) -> str | None:
    if e["kind"] == "tool_call":
        return error_class(e["error"]) if e.get("error") else None
    return e["kind"] if e["kind"] in ("failure", "sandbox_failed") else None


def seed(store: Store, events: list[dict[str, Any]] | None = None) -> None:
    store.put_tenant("globex", {}, None)
    with store.db.begin() as db:
        db.execute(insert(Session), [
            {"tenant_id": t, "session_id": s, "scenario": sc, "created_at": c, "closed_at": x,
             "state": "closed" if x else "open", "generation": 1}
            for t, s, sc, c, x in SESSIONS
        ])  # fmt: skip
    store.add_events(timeline() if events is None else events)


def approx(answer: Any) -> Any:
    """An answer with its floats compared to 1e-9 (sums of the same seconds in another order)."""
    if isinstance(answer, dict):
        return {k: approx(v) for k, v in answer.items()}
    if isinstance(answer, list):
        return [approx(v) for v in answer]
    return pytest.approx(answer, rel=1e-9, abs=1e-9) if isinstance(answer, float) else answer


RANGES = [
    (T0, T0 + 7 * HOUR),  # hourly buckets
    (T0 + 30 * M, T0 + 6 * HOUR + 45 * M),  # the edges' partial hours raw
    (T0 - 11 * HOUR, T0 + 8 * HOUR),  # 6-hourly (since before the oldest event)
    (T0 + 2 * HOUR, T0 + 3 * HOUR),  # 1-minute buckets, all raw
    (T0 - 12 * DAY, T0 + DAY + 2 * HOUR),  # daily, with the day rows
]


def reads(store: Store) -> list[Any]:
    out: list[Any] = []
    for since, until in RANGES:
        for tenant, scenario in ((None, None), ("acme", None), ("acme", "grading")):
            out.append(series.series(store, tenant, scenario, since, until))
            out.append(queries.stats(store, tenant, scenario, since, until))
    return out


def hour_rows(store: Store) -> list[tuple[Any, ...]]:
    r = EventRollup
    q = select(r.start_at, r.tenant_id, r.scenario, r.events).where(r.span_s == HOUR)
    with store.db() as db:
        return sorted(tuple(x) for x in db.execute(q))


def test_the_index_reads_the_kinds_the_tally_does() -> None:
    assert all(f"'{kind}'" in LIFECYCLE_SQL for kind in LIFECYCLE)
    assert LIFECYCLE_SQL.count("'") == 2 * len(LIFECYCLE)


def test_series_counts_per_bucket_as_worked_out_by_hand(store: Store) -> None:
    seed(store)
    events = timeline()
    for rolled in (False, True):
        if rolled:
            assert rollups.roll_up(store.engine, LAG, now=T0 + 8 * HOUR + 2 * LAG, max_hours=99)
        s = series.series(store, None, None, T0, T0 + 7 * HOUR)
        assert s["bucket_s"] == HOUR and s["buckets"] == [T0 + i * HOUR for i in range(7)]
        groups = {(g["tenant"], g["scenario"]): g for g in s["groups"]}
        assert set(groups) == {("acme", "grading"), ("acme", "tutoring"), ("globex", None)}
        for key, g in groups.items():
            for i, start in enumerate(s["buckets"]):
                mine = [e for e in events if GROUP[e["session_id"]] == key
                        and start <= e["at"] < start + HOUR]  # fmt: skip
                assert g["events"][i] == len(mine), (key, i)
                assert g["tool_calls"][i] == sum(e["kind"] == "tool_call" for e in mine)
                classes: dict[str, int] = {}
                for e in mine:
                    c = failure_class(e)
                    if c:
                        classes[c] = classes.get(c, 0) + 1
                got = {k: v[i] for k, v in g["failure_classes"].items() if v[i]}
                assert got == classes and g["failures"][i] == sum(classes.values())
                running = expected_seconds(key, False, start, start + HOUR)
                paused = expected_seconds(key, True, start, start + HOUR)
                assert g["sandbox_hours"][i] == round(running / 3600, 4), (key, i)
                assert g["live"][i] == round(running / HOUR, 3)
                assert g["paused"][i] == round(paused / HOUR, 3), (key, i)
        # spot checks of the hand-made figures themselves
        grading, tutoring = groups[("acme", "grading")], groups[("acme", "tutoring")]
        assert grading["tool_calls"][:3] == [50, 50, 0]
        assert grading["live"][0] == 1.0  # running since before the range
        assert grading["paused"][2] == 0.5  # paused at 2:30
        assert tutoring["failure_classes"] == {
            "command_timeout": [2, 2, 0, 0, 0, 0, 0],
            "error": [1, 0, 0, 0, 0, 0, 0],
            "not_found": [2, 0, 0, 0, 0, 0, 0],
            "sandbox_failed": [0, 1, 0, 0, 0, 0, 0],
        }
        assert tutoring["paused"][4:] == [1.0, 1.0, 1.0]  # paused, never resumed
        assert s["total"]["tool_calls"] == [60, 60, 0, 1, 0, 0, 0]


def test_percentiles_are_within_the_histograms_resolution(store: Store) -> None:
    seed(store)
    exact = [float(i + 1) for i in range(100)]  # group (acme, grading)'s durations
    for rolled in (False, True):
        if rolled:
            rollups.roll_up(store.engine, LAG, now=T0 + 8 * HOUR + 2 * LAG, max_hours=99)
        st = queries.stats(store, "acme", "grading", T0, T0 + 7 * HOUR)
        [g] = st["groups"]
        for q, got in ((0.5, g["p50_ms"]), (0.95, g["p95_ms"])):
            want = exact[round(q * 99)]
            assert abs(got - want) / want <= math.sqrt(GAMMA) - 1 + 1e-9, (q, got, want)
        assert g["tool_calls"] == 100 and g["failures"] == 0
        assert g["sessions"] == 1  # a (d closed before the range)
        assert g["sandbox_hours"] == round(
            expected_seconds(("acme", "grading"), False, T0, T0 + 7 * HOUR) / 3600, 4
        )


def test_rollups_give_what_raw_events_give(store: Store) -> None:
    seed(store)
    raw = reads(store)
    assert rollups.roll_up(store.engine, LAG, now=T0 + DAY + 2 * HOUR + LAG, max_hours=999)
    with store.db() as db:
        assert db.scalar(select(func.count()).where(EventRollup.span_s == DAY)) >= 2
        assert db.scalar(select(EventRollupMark.last_hour)) == T0 + DAY + HOUR
    assert reads(store) == approx(raw)
    stats = queries.stats(store, None, None, T0, T0 + 7 * HOUR)
    assert stats["events"] == sum(T0 <= e["at"] <= T0 + 7 * HOUR for e in timeline())
    # and they were read from the rollups: the rolled hours' raw events are not needed
    with store.engine.begin() as conn:
        conn.execute(delete(Event).where(Event.at < T0 + DAY + 2 * HOUR))
    assert queries.stats(store, None, None, T0, T0 + 7 * HOUR) == approx(stats)
    for since, until in ((T0, T0 + 7 * HOUR), (T0 - 12 * DAY, T0 + DAY + 2 * HOUR)):
        assert series.series(store, None, None, since, until) == approx(
            raw[RANGES.index((since, until)) * 6]
        )


def test_an_hour_waits_for_its_lag_and_takes_what_came_before(store: Store) -> None:
    seed(store)
    end = T0 + 8 * HOUR  # the end of hour 7
    rollups.roll_up(store.engine, LAG, now=end + LAG - 1, max_hours=999)
    with store.db() as db:
        assert db.scalar(select(EventRollupMark.last_hour)) == T0 + 6 * HOUR
    late = {"tenant_id": "acme", "session_id": "b", "kind": "tool_call", "at": T0 + 7.5 * HOUR,
            "tool": "run_command", "duration_ms": 3.0}  # fmt: skip
    store.add_events([late])  # committed late, before the lag passed
    assert rollups.roll_up(store.engine, LAG, now=end + LAG, max_hours=999) == 1
    rows = [r for r in hour_rows(store) if r[0] == T0 + 7 * HOUR and r[2] == "tutoring"]
    assert rows == [(T0 + 7 * HOUR, "acme", "tutoring", 1)]
    s = series.series(store, "acme", "tutoring", T0, end)
    assert s["total"]["tool_calls"][7] == 1


def test_an_event_written_into_a_rolled_up_hour_rolls_it_up_again(store: Store) -> None:
    seed(store)
    now = T0 + 8 * HOUR + LAG
    rollups.roll_up(store.engine, LAG, now=now, max_hours=999)
    with store.db() as db:
        assert db.scalar(select(EventRollupMark.last_hour)) == T0 + 7 * HOUR
    # a stop recorded long after it happened, and a call of that hour: hour 2 changes
    late = [{"tenant_id": "globex", "session_id": "c", "kind": "sandbox_paused",
             "at": T0 + 2 * HOUR + 15 * M, "sandbox_id": "c1"},
            {"tenant_id": "globex", "session_id": "c", "kind": "tool_call", "tool": "run_code",
             "at": T0 + 2 * HOUR + 20 * M, "duration_ms": 7.0}]  # fmt: skip
    store.add_events(late)
    with store.engine.begin() as conn:  # what the raw events say now
        conn.execute(delete(EventRollupMark))
        conn.execute(delete(EventRollup))
    rollups.roll_up(store.engine, LAG, now=now, max_hours=999)
    want = hour_rows(store), reads(store)
    with store.engine.begin() as conn:  # the rollups of before the late events...
        conn.execute(delete(Event).where(Event.id > 0, Event.at.in_([e["at"] for e in late])))
        conn.execute(delete(EventRollupMark))
        conn.execute(delete(EventRollup))
    rollups.roll_up(store.engine, LAG, now=now, max_hours=999)
    assert hour_rows(store) != want[0]
    store.add_events(late)  # ...then the late events: the hours from 2 on are rolled again
    assert rollups.roll_up(store.engine, LAG, now=now, max_hours=999) == 6  # hours 2 to 7
    assert hour_rows(store) == want[0]
    assert reads(store) == approx(want[1])
    globex = series.series(store, "globex", None, T0, T0 + 7 * HOUR)
    assert globex["total"]["tool_calls"][2] == 1 and globex["total"]["paused"][2] == 0.75
    assert rollups.roll_up(store.engine, LAG, now=now, max_hours=999) == 0  # and once only


def test_a_fresh_start_catches_up_from_the_oldest_event_and_skips_empty_hours(
    store: Store,
) -> None:
    assert rollups.roll_up(store.engine, LAG, now=T0) == 0  # nothing yet: no mark either
    with store.db() as db:
        assert db.scalar(select(func.count()).select_from(EventRollupMark)) == 0
    seed(store)
    n = rollups.roll_up(store.engine, LAG, now=T0 + 8 * HOUR + LAG, max_hours=999)
    with store.db() as db:
        first, last = db.execute(
            select(EventRollupMark.first_hour, EventRollupMark.last_hour)
        ).one()
    assert (first, last) == (T0 - 10 * HOUR, T0 + 7 * HOUR)
    assert n < 18  # the empty hours between d's and a's spans passed over in one step
    assert {r[0] for r in hour_rows(store)} >= {T0 - 10 * HOUR, T0 - 2 * HOUR, T0}


def race(s: Store, barrier: threading.Barrier, out: list[Any]) -> None:
    """One replica's job, started with the others' at the barrier: how many hours it rolled."""
    try:
        barrier.wait()
        out.append(rollups.roll_up(s.engine, LAG, now=T0 + DAY + LAG, max_hours=999))
    except BaseException as e:  # (the test reports them)
        out.append(e)


def test_racing_replicas_roll_each_hour_once(store: Store) -> None:
    seed(store)
    alone = rollups.roll_up(store.engine, LAG, now=T0 + DAY + LAG, max_hours=999)
    want = hour_rows(store)
    before = sum(T0 - 10 * HOUR <= e["at"] < T0 + DAY for e in timeline())
    assert sum(r[3] for r in want) == before
    for _round in range(4):
        with store.engine.begin() as conn:
            conn.execute(delete(EventRollupMark))
            conn.execute(delete(EventRollup))
        replicas = [Store(store.url) for _ in range(2)]
        done: list[Any] = []
        barrier = threading.Barrier(len(replicas))
        threads = [threading.Thread(target=race, args=(s, barrier, done)) for s in replicas]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for s in replicas:
            s.close()
        assert all(isinstance(n, int) for n in done), done
        assert sum(done) == alone  # every step taken by one replica only
        assert hour_rows(store) == want  # each event once: nothing doubled
