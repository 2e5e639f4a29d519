"""The console's usage views over 10 million timeline events and 30 days, from the hourly
rollups (store/rollups.py, console/series.py): the store side of console_bench.py at scale.

    .venv/bin/python bench/console_rollups_bench.py [--events 10000000] [--sessions 5000]
        [--days 30] [--n 20] [--stores sqlite,postgresql] [--out bench/results/console_rollups.json]

Per store of ``--stores`` (PostgreSQL: a throw-away server on a unix socket,
tests/gateway/postgres.py), a migrated gateway store gets ``--sessions`` sessions of 3 tenants and
5 scenarios and ``--events`` timeline events over the last ``--days`` days, up to now (tool calls
with lognormal durations, some failing; sandbox creates, pauses, resumes, failures, reclaims),
bulk-loaded (SQLite: executemany in transactions of 200,000 rows; PostgreSQL: COPY). Then:
- ``load_s``: the load; ``catch_up``: the rollup job catching up from the oldest event, as a
  gateway replica does at its first start (hours rolled, seconds);
- ``query``: ``stats`` and ``series`` for the last 30 days, 7 days, 24 hours and 1 hour, ``--n``
  runs each after a warm-up (milliseconds; series picks daily, 6-hourly, hourly, 1-minute
  buckets), in this process, on the store as the gateway reads it;
- ``raw``: for contrast, ``stats`` of the last 24 hours with the rollups set aside (every event
  read, as before them), 3 runs;
- ``plans`` (SQLite): EXPLAIN QUERY PLAN of the sandbox-state and events queries.
Prints one JSON document and writes it to --out.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import delete, event, insert, select, text

from benchstats import summary, write_result
from sandhold.console import queries, series
from sandhold.store import rollups
from sandhold.store.db import Store
from sandhold.store.models import EventRollupMark, Session

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.gateway.postgres import Postgres

DAY = 86400.0
TENANTS = ("acme", "globex", "initech")
TENANT_WEIGHTS = (0.5, 0.3, 0.2)
SCENARIOS = ("grading", "tutoring", "office-docs", "data-analysis", "code-review")
TOOLS = ("run_command", "read_file", "write_file", "list_files")
TOOL_WEIGHTS = (0.6, 0.2, 0.15, 0.05)
ERRORS = ("command_timeout: the command ran past its timeout of 60 s",
          "not_found: no such file: /workspace/out/report.md",
          "file_view_denied: write to /etc/passwd denied",
          "sandbox_unavailable: the provider did not answer")  # fmt: skip
COLUMNS = ("at", "tenant_id", "session_id", "kind", "sandbox_id", "tool", "duration_ms",
           "exit_code", "error", "reason")  # fmt: skip
RANGES = {"30d": 30 * DAY, "7d": 7 * DAY, "24h": DAY, "1h": 3600.0}


def plan(n_events: int, n_sessions: int, days: float, now: float, seed: int) -> list[dict]:
    """Sessions (rows of the sessions table) with how many events each will have over its
    whole life (``size``) and when it ends (``end``, maybe after now: then it is open, and only
    its events so far are written); sized so that about ``n_events`` are written."""
    rng = random.Random(seed)
    out = []
    for i in range(n_sessions):
        w = rng.paretovariate(1.6)
        start = now - days * DAY + rng.random() * (days * DAY - 600)
        length = min(3 * DAY, rng.lognormvariate(math.log(2 * 3600), 1.0) * (1 + w))
        closed = start + length < now
        out.append({"tenant_id": rng.choices(TENANTS, TENANT_WEIGHTS)[0],
                    "session_id": f"bench-{i:05d}", "scenario": rng.choice(SCENARIOS),
                    "state": "closed" if closed else "open", "generation": 1,
                    "created_at": start, "closed_at": start + length if closed else None,
                    "end": start + length, "w": w})  # fmt: skip
    so_far = [min(1.0, (now - s["created_at"]) / (s["end"] - s["created_at"])) for s in out]
    scale = n_events / sum(s["w"] * f for s, f in zip(out, so_far, strict=True))
    for s in out:
        s["size"] = max(4, round(s.pop("w") * scale))
    return out


def session_events(s: dict[str, Any], now: float, rng: random.Random) -> Iterator[tuple]:
    """One session's events in time order (tuples of COLUMNS), up to now."""
    t, sid, size = s["tenant_id"], s["session_id"], s["size"]
    start, end = s["created_at"], s["end"]
    times = sorted(at for at in (rng.uniform(start, end) for _ in range(size)) if at < now)
    sbx = uuid.uuid4().hex[:20]
    state = "none"
    last = len(times) - 1
    for j, at in enumerate(times):
        if j == 0 or state == "none":
            state = "running"
            yield (at, t, sid, "sandbox_created", sbx, None, rng.uniform(150, 900), None, None,
                   None)  # fmt: skip
        elif j == last and s["closed_at"] is not None:
            yield (at, t, sid, "sandbox_reclaimed", sbx, None, None, None, None, "retention")
        elif state == "paused":
            state = "running"
            yield (at, t, sid, "sandbox_resumed", sbx, None, rng.uniform(40, 300), None, None,
                   None)  # fmt: skip
        else:
            r = rng.random()
            if r < 0.04:
                state = "paused"
                yield (at, t, sid, "sandbox_paused", sbx, None, None, None, None, "keep-alive")
            elif r < 0.043:
                state, failed, sbx = "none", sbx, uuid.uuid4().hex[:20]
                yield (at, t, sid, "sandbox_failed", failed, None, None, None, None, "agent gone")
            else:
                tool = rng.choices(TOOLS, TOOL_WEIGHTS)[0]
                err = rng.choice(ERRORS) if rng.random() < 0.04 else None
                code = int(rng.random() < 0.1) if tool == "run_command" else None
                ms = rng.lognormvariate(3.7, 0.9)
                yield (at, t, sid, "tool_call", sbx, tool, ms, code, err, None)


def all_events(sessions: list[dict[str, Any]], now: float, seed: int) -> list[tuple]:
    rng = random.Random(seed + 1)
    events = [e for s in sessions for e in session_events(s, now, rng)]
    events.sort(key=lambda e: e[0])
    return events


def load_sqlite(path: str, events: list[tuple], chunk: int = 200_000) -> None:
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA synchronous=OFF")  # a bulk load: the file is thrown away after
        sql = f"INSERT INTO events ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
        for k in range(0, len(events), chunk):
            with db:
                db.executemany(sql, events[k : k + chunk])
        db.execute("ANALYZE")
    finally:
        db.close()


def load_postgres(store: Store, events: list[tuple], chunk: int = 1_000_000) -> None:
    raw = store.engine.raw_connection()
    try:
        pg: Any = raw.driver_connection
        for k in range(0, len(events), chunk):
            with (
                pg.cursor() as cur,
                cur.copy(f"COPY events ({', '.join(COLUMNS)}) FROM STDIN") as cp,
            ):
                for row in events[k : k + chunk]:
                    cp.write_row(row)
            pg.commit()
        pg.autocommit = True
        pg.execute("VACUUM ANALYZE")  # what autovacuum does on its own after a load
        pg.autocommit = False
    finally:
        raw.close()


def timed(fn: Callable[[], Any], n: int) -> tuple[dict[str, float], Any]:
    fn()  # warm (connections, page cache)
    took, out = [], None
    for _ in range(n):
        t = time.perf_counter()
        out = fn()
        took.append((time.perf_counter() - t) * 1000)
    return summary(took), out


def plans(store: Store, now: float) -> dict[str, list[str]]:
    """EXPLAIN QUERY PLAN of the statements one raw hour runs (SQLite)."""
    seen: list[tuple[str, Any]] = []

    def grab(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            seen.append((statement, params))

    event.listen(store.engine, "before_cursor_execute", grab)
    try:
        tally = rollups.Tally(now - 1800, 600.0)
        with store.engine.connect() as conn:
            rollups.tally_raw(conn, tally, now - 1800, now - 1200)
    finally:
        event.remove(store.engine, "before_cursor_execute", grab)
    out = {}
    with store.engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        for name, (statement, params) in zip(("counts", "states", "lifecycle"), seen, strict=False):
            rows = raw.execute("EXPLAIN QUERY PLAN " + statement, params).fetchall()
            out[name] = [r[-1] for r in rows]
    return out


def run_store(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="sandhold-rollup-bench-", dir="/var/tmp"))
    pg = Postgres() if kind == "postgresql" else None
    try:
        if pg is not None:
            pg.start()
            url = pg.database("rollup_bench")
        else:
            url = f"sqlite:///{work / 'gateway.db'}"
        store = Store(url)
        store.migrate()
        for t in TENANTS:
            store.put_tenant(t, {}, None)
        now = time.time()
        t = time.perf_counter()
        sessions = plan(args.events, args.sessions, args.days, now, seed=17)
        events = all_events(sessions, now, seed=17)
        result: dict[str, Any] = {"store": kind, "events": len(events), "sessions": len(sessions),
                                  "generate_s": round(time.perf_counter() - t, 1)}  # fmt: skip
        print(
            f"[{kind}] generated {len(events)} events in {result['generate_s']} s", file=sys.stderr
        )
        t = time.perf_counter()
        rows = [{k: v for k, v in s.items() if k not in ("size", "end")} for s in sessions]
        with store.db.begin() as db:
            db.execute(insert(Session), rows)
        if pg is None:
            load_sqlite(str(work / "gateway.db"), events)
        else:
            load_postgres(store, events)
        result["load_s"] = round(time.perf_counter() - t, 1)
        del events
        print(f"[{kind}] loaded in {result['load_s']} s", file=sys.stderr)

        t = time.perf_counter()
        hours = rollups.roll_up(store.engine, 300.0, max_hours=10**6)
        took = time.perf_counter() - t
        result["catch_up"] = {"hours": hours, "s": round(took, 1),
                              "ms_per_hour": round(took * 1000 / max(hours, 1), 1)}  # fmt: skip
        print(f"[{kind}] caught up {hours} hours in {took:.1f} s", file=sys.stderr)
        if pg is not None:
            with store.engine.begin() as conn:
                conn.execute(text("ANALYZE event_rollups"))

        query: dict[str, Any] = {}
        for name, span in RANGES.items():
            for what, fn in (("stats", queries.stats), ("series", series.series)):

                def call(fn: Any = fn, span: float = span) -> Any:
                    now = time.time()
                    return fn(store, None, None, now - span, now)

                s, out = timed(call, args.n)
                rows_n = out["events"] if what == "stats" else sum(out["total"]["events"])
                extra = {"events_in_range": rows_n}
                if what == "series":
                    extra["bucket_s"] = out["bucket_s"]
                    extra["buckets"] = len(out["buckets"])
                query[f"{what}_{name}"] = {**s, **extra}
                print(
                    f"[{kind}] {what} {name}: {s['p50']} ms p50, {rows_n} events", file=sys.stderr
                )

            def one(span: float = span) -> Any:  # one tenant and scenario, as a tenant asks
                now = time.time()
                return queries.stats(store, "acme", "grading", now - span, now)

            query[f"stats_{name}_one_tenant_scenario"] = timed(one, args.n)[0]
        result["query"] = query

        with store.engine.begin() as conn:
            mark = conn.execute(select(EventRollupMark)).one()._asdict()
            conn.execute(delete(EventRollupMark))  # set aside: every read goes to the events
        try:
            now = time.time()
            raw_s, out = timed(lambda: queries.stats(store, None, None, now - DAY, now), 3)
            result["raw"] = {"stats_24h": {**raw_s, "events_in_range": out["events"]}}
        finally:
            with store.engine.begin() as conn:
                conn.execute(insert(EventRollupMark).values(mark))
        print(f"[{kind}] raw stats 24h: {result['raw']['stats_24h']['p50']} ms", file=sys.stderr)
        if pg is None:
            result["plans"] = plans(store, time.time())
        store.close()
        return result
    finally:
        if pg is not None:
            pg.stop()
        for f in work.glob("*"):
            f.unlink()
        work.rmdir()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--sessions", type=int, default=5000)
    ap.add_argument("--days", type=float, default=30)
    ap.add_argument("--n", type=int, default=20, help="runs of each query")
    ap.add_argument("--stores", default="sqlite,postgresql")
    ap.add_argument("--out", default="bench/results/console_rollups.json")
    args = ap.parse_args()
    result: dict[str, Any] = {
        "host": {"cpus": os.cpu_count(), "loadavg_start": [round(x, 2) for x in os.getloadavg()]},
        "params": {
            "events": args.events,
            "sessions": args.sessions,
            "days": args.days,
            "n": args.n,
        },
        "stores": {},
    }
    for kind in args.stores.split(","):
        result["stores"][kind] = run_store(kind, args)
    result["host"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    write_result(args.out, result)


if __name__ == "__main__":
    main()
