"""The gateway console with 100,000 timeline events (issue 17, "Dashboard page load").

    .venv/bin/python bench/console_bench.py [--events 100000] [--sessions 1000] [--n 15]
        [--pages 8] [--stores sqlite,postgresql] [--out bench/results/console.json]

Per store of ``--stores`` (PostgreSQL: a throw-away server on a unix socket,
tests/gateway/postgres.py), a real `sandhold gateway serve` (``local`` provider) gets a few
real tool calls through REST (one real sandbox, a failed read), then ``--events`` timeline
events over ``--sessions`` sessions of 2 tenants and 5 scenarios over the last 7 days,
inserted directly through ``sandhold.store`` while it runs (mostly tool calls with durations,
some failing; sandbox creates, pauses, resumes, reclaims, failures). Then, in milliseconds:
- ``api``: each console API call over HTTP (httpx, the admin key), ``--n`` times each: stats
  for 24 h, 7 d and 30 d, sessions' first page (100), the biggest session's timeline's first
  page (200), failures (200);
- ``query``: the same queries in this process (sandhold.console.queries on the same store),
  to tell the database's part from HTTP and JSON's;
- ``browser``: Playwright driving Debian's Chromium (headless), ``--pages`` times, each in a
  fresh context: open /console, sign in, until the overview's table is visible (24 h); the
  range switched to 7 d; Sessions; one session's timeline;
- ``plans``: EXPLAIN QUERY PLAN of each query (SQLite).
Prints one JSON document and writes it to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import Browser, sync_playwright
from sqlalchemy import event, insert, text

from benchstats import summary, write_result
from sandhold.console import queries
from sandhold.store.db import Store
from sandhold.store.models import Session

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.gateway.postgres import Postgres
from tests.support.gateway_server import (
    ADMIN_KEY,
    OTHER_KEY,
    TENANT_KEY,
    Gateway,
    destroy_runtime_dir,
    gateway_env,
    scratch_dir,
)

CHROMIUM = "/usr/bin/chromium"
# the last fetch of an API call as the page saw it (Resource Timing: request to last byte)
FETCH_MS = """(path) => { const e = performance.getEntriesByType("resource")
  .filter((r) => r.name.endsWith(path)); return e.length ? e[e.length - 1].duration : null; }"""
ROWS = {"sessions": "sessions", "timeline": "events", "failures": "failures"}  # answer's rows
DAY = 86400.0
TENANTS = (("acme", 0.6), ("globex", 0.4))
SCENARIOS = ("grading", "tutoring", "office-docs", "data-analysis", "code-review")
TOOLS = (("run_command", 0.6), ("read_file", 0.2), ("write_file", 0.15), ("list_files", 0.05))
ERRORS = ("command_timeout: the command ran past its timeout of 60 s",
          "not_found: no such file: /workspace/out/report.md",
          "file_view_denied: write to /etc/passwd denied",
          "sandbox_unavailable: the provider did not answer")  # fmt: skip


def pick(rng: random.Random, weighted: tuple[tuple[str, float], ...]) -> str:
    return rng.choices([w[0] for w in weighted], [w[1] for w in weighted])[0]


def synthetic(n_events: int, n_sessions: int, now: float, seed: int = 17) -> tuple[list, list]:
    """Sessions (rows of the sessions table) and their events, in time order."""
    rng = random.Random(seed)
    weights = [rng.paretovariate(1.6) for _ in range(n_sessions)]
    scale = n_events / sum(weights)
    sizes = [max(3, int(w * scale)) for w in weights]
    sizes[sizes.index(max(sizes))] += n_events - sum(sizes)  # exactly n_events in all
    starts = sorted(now - 7 * DAY + rng.random() * (7 * DAY - 600) for _ in range(n_sessions))
    sessions: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    for i, (start, size) in enumerate(zip(starts, sizes, strict=True)):
        tenant, scenario = pick(rng, TENANTS), rng.choice(SCENARIOS)
        sid = f"bench-{i:04d}"
        end = min(now - 1, start + rng.uniform(600, 6 * 3600) * (1 + size / 500))
        closed = end < now - 3600
        sessions.append({"tenant_id": tenant, "session_id": sid, "state": "closed" if closed
                         else "open", "scenario": scenario, "generation": 1,
                         "created_at": start, "closed_at": end if closed else None})  # fmt: skip
        sbx = uuid.uuid4().hex[:20]
        times = sorted(rng.uniform(start, end) for _ in range(size))
        base = {"tenant_id": tenant, "session_id": sid, "sandbox_id": sbx}
        paused = False
        for j, at in enumerate(times):
            e: dict[str, Any] = {**base, "at": at, "tool": None, "duration_ms": None,
                                 "exit_code": None, "error": None, "reason": None}  # fmt: skip
            if j == 0:
                e.update(kind="sandbox_created", duration_ms=round(rng.uniform(150, 900), 2))
            elif j == size - 1 and closed:
                e.update(kind="sandbox_reclaimed", reason="retention expired")
            elif paused:
                e.update(kind="sandbox_resumed", duration_ms=round(rng.uniform(40, 300), 2))
                paused = False
            elif rng.random() < 0.04:
                e.update(kind="sandbox_paused", reason="keep-alive expired (on_timeout=pause)")
                paused = True
            elif rng.random() < 0.003:
                e.update(kind="sandbox_failed", reason="the sandbox's agent stopped answering")
            else:
                tool = pick(rng, TOOLS)
                err = rng.choice(ERRORS) if rng.random() < 0.04 else None
                code = int(rng.random() < 0.1) if tool == "run_command" else None
                ms = round(rng.lognormvariate(3.7, 0.9), 2)
                e.update(kind="tool_call", tool=tool, error=err, duration_ms=ms, exit_code=code)
            events.append(e)
    events.sort(key=lambda e: e["at"])
    return sessions, events


def fill(url: str, sessions: list[dict], events: list[dict]) -> dict[str, float]:
    store = Store(url)
    try:
        t = time.perf_counter()
        with store.db.begin() as db:
            db.execute(insert(Session), sessions)
        for k in range(0, len(events), 10_000):
            store.add_events(events[k : k + 10_000])
        took = time.perf_counter() - t
        if not url.startswith("sqlite"):  # what autovacuum does on its own shortly after
            with store.engine.begin() as conn:
                conn.execute(text("ANALYZE"))
    finally:
        store.close()
    return {"fill_s": round(took, 2), "events": len(events), "sessions": len(sessions)}


def timed(fn: Callable[[], Any], n: int) -> tuple[dict[str, float], Any]:
    out, took = None, []
    fn()  # warm (connections, page cache)
    for _ in range(n):
        t = time.perf_counter()
        out = fn()
        took.append((time.perf_counter() - t) * 1000)
    return summary(took), out


def api_calls(now: float, biggest: tuple[str, str]) -> dict[str, tuple[str, dict[str, Any]]]:
    tenant, session = biggest
    return {
        "stats_24h": ("stats", {"since": now - DAY, "until": now}),
        "stats_7d": ("stats", {"since": now - 7 * DAY, "until": now}),
        "stats_30d": ("stats", {"since": now - 30 * DAY, "until": now}),
        "sessions_first_page": ("sessions", {"since": now - DAY, "until": now, "limit": 100}),
        "sessions_7d_first_page": (
            "sessions",
            {"since": now - 7 * DAY, "until": now, "limit": 100},
        ),
        "timeline_first_page": ("timeline", {"tenant": tenant, "session": session, "limit": 200}),
        "failures_24h": ("failures", {"since": now - DAY, "until": now, "limit": 200}),
        "failures_7d": ("failures", {"since": now - 7 * DAY, "until": now, "limit": 200}),
    }


def run_query(store: Store, name: str, body: dict[str, Any]) -> Any:
    if name == "stats":
        return queries.stats(store, None, None, body["since"], body["until"])
    if name == "sessions":
        return queries.sessions(store, None, None, body["since"], body["until"], None,
                                body["limit"])  # fmt: skip
    if name == "timeline":
        return queries.timeline(store, body["tenant"], body["session"], None, body["limit"])
    return queries.failures(store, None, None, body["since"], body["until"], body["limit"])


def plans(store: Store, calls: dict[str, tuple[str, dict[str, Any]]]) -> dict[str, list]:
    """EXPLAIN QUERY PLAN of every statement each query runs (SQLite)."""
    seen: list[tuple[str, Any]] = []

    def grab(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            seen.append((statement, params))

    event.listen(store.engine, "before_cursor_execute", grab)
    out: dict[str, list] = {}
    try:
        for label, (name, body) in calls.items():
            seen.clear()
            run_query(store, name, body)
            steps = []
            with store.engine.connect() as conn:
                for statement, params in list(seen):
                    raw = conn.connection.dbapi_connection
                    rows = raw.execute("EXPLAIN QUERY PLAN " + statement, params).fetchall()
                    plan: list[str] = []  # (an OR of 100 sessions: its step once)
                    for r in rows:
                        if r[-1] not in plan:
                            plan.append(r[-1])
                    steps.append(plan)
            out[label] = steps
    finally:
        event.remove(store.engine, "before_cursor_execute", grab)
    return out


def browser_loads(browser: Browser, url: str, pages: int) -> dict[str, Any]:
    took: dict[str, list[float]] = defaultdict(list)
    for i in range(pages + 1):  # the first: warm-up, not counted
        ctx = browser.new_context()
        page = ctx.new_page()
        try:
            ms: dict[str, float] = {}
            t0 = time.perf_counter()
            page.goto(f"{url}/console")
            page.get_by_label("Admin or tenant key").fill(ADMIN_KEY)
            t1 = time.perf_counter()
            page.get_by_role("button", name="Sign in").click()
            page.locator("main table tbody tr").first.wait_for(state="visible", timeout=60_000)
            t2 = time.perf_counter()
            ms["overview_24h"], ms["sign_in_to_overview"] = (t2 - t0) * 1000, (t2 - t1) * 1000
            ms["stats_24h_fetch_in_page"] = page.evaluate(FETCH_MS, "/console/api/stats")
            page.get_by_label("time range").select_option(label="last 7d")
            t = time.perf_counter()
            page.get_by_role("button", name="Show").click()
            page.locator("main table tbody tr").first.wait_for(state="visible", timeout=60_000)
            ms["overview_7d"] = (time.perf_counter() - t) * 1000
            ms["stats_7d_fetch_in_page"] = page.evaluate(FETCH_MS, "/console/api/stats")
            t = time.perf_counter()
            page.get_by_role("button", name="Sessions").click()
            page.locator("main table tbody tr").first.wait_for(state="visible", timeout=60_000)
            ms["sessions"] = (time.perf_counter() - t) * 1000
            t = time.perf_counter()
            page.locator("main button.session").first.click()
            page.get_by_role("heading", level=2).filter(has_text="Timeline").wait_for()
            page.locator("main table tbody tr").first.wait_for(state="visible", timeout=60_000)
            ms["timeline"] = (time.perf_counter() - t) * 1000
            if i:
                for k, v in ms.items():
                    if v is not None:
                        took[k].append(v)
        finally:
            ctx.close()
    return {k: summary(v) for k, v in took.items()}


def real_calls(gw: Gateway) -> int:
    """A few real tool calls: one real sandbox per tenant, a failed read."""
    n = 0
    for key, session, scenario in ((TENANT_KEY, "real-acme", "grading"),
                                   (OTHER_KEY, "real-globex", "office-docs")):  # fmt: skip
        with gw.client(key) as c:
            h = {"X-Sandhold-Scenario": scenario}
            for tool, args in (("run_command", {"command": "echo hello"}),
                               ("write_file", {"path": "a.txt", "content": "x"}),
                               ("read_file", {"path": "missing.txt"}),
                               ("run_command", {"command": "ls"})):  # fmt: skip
                r = c.post(f"/v1/sessions/{session}/tools/{tool}", json=args, headers=h)
                assert r.status_code < 500, r.text
                n += 1
    return n


def run_store(kind: str, args: argparse.Namespace, browser: Browser) -> dict[str, Any]:
    data_dir = scratch_dir("sandhold-console-bench-")
    pg = Postgres() if kind == "postgresql" else None
    gw = None
    try:
        extra: dict[str, Any] = {"gateway_workspace_root": data_dir / "workspaces"}
        if pg is not None:
            pg.start()
            extra["gateway_store_url"] = pg.database("console_bench")
        url = extra.get("gateway_store_url") or f"sqlite:///{data_dir / 'gateway' / 'gateway.db'}"
        env = gateway_env(data_dir, "local", None, f"cb{uuid.uuid4().hex[:8]}", **extra)
        gw = Gateway(data_dir, env, data_dir / "gateway.log")
        gw.start()
        result: dict[str, Any] = {"store": kind, "real_tool_calls": real_calls(gw)}
        now = time.time()
        sessions, events = synthetic(args.events, args.sessions, now)
        result.update(fill(url, sessions, events))
        counts = Counter((e["tenant_id"], e["session_id"]) for e in events)
        biggest = max(counts, key=lambda k: counts[k])
        result["biggest_session_events"] = counts[biggest]
        now = time.time()
        calls = api_calls(now, biggest)
        api: dict[str, Any] = {}
        with httpx.Client(base_url=gw.url, timeout=120,
                          headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as c:  # fmt: skip

            def post(name: str, body: dict[str, Any]) -> dict[str, Any]:
                r = c.post(f"/console/api/{name}", json=body)
                r.raise_for_status()
                return {"bytes": len(r.content), "json": r.json()}

            for label, (name, body) in calls.items():
                s, out = timed(lambda n=name, b=body: post(n, b), args.n)
                j = out["json"]
                rows = j["events"] if name == "stats" else len(j[ROWS[name]])
                api[label] = {**s, "bytes": out["bytes"], "rows": rows}
                print(f"[{kind}] api {label}: {s['p50']} ms p50, {rows} rows", file=sys.stderr)
        result["api"] = api
        store = Store(url)
        try:
            result["query"] = {label: timed(lambda n=name, b=body: run_query(store, n, b),
                                            args.n)[0]
                               for label, (name, body) in calls.items()}  # fmt: skip
            if kind == "sqlite":
                result["plans"] = plans(store, calls)
        finally:
            store.close()
        result["browser"] = browser_loads(browser, gw.url, args.pages)
        print(f"[{kind}] browser: {json.dumps(result['browser'])}", file=sys.stderr)
        return result
    finally:
        if gw is not None:
            gw.close()
        problems = destroy_runtime_dir(data_dir)
        if problems:
            print(f"cleanup: {problems}", file=sys.stderr)
        if pg is not None:
            pg.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--n", type=int, default=15, help="runs of each API call")
    ap.add_argument("--pages", type=int, default=8, help="browser page loads")
    ap.add_argument("--stores", default="sqlite,postgresql")
    ap.add_argument("--out", default="bench/results/console.json")
    args = ap.parse_args()
    result: dict[str, Any] = {
        "host": {"cpus": os.cpu_count(), "loadavg_start": [round(x, 2) for x in os.getloadavg()]},
        "params": {
            "events": args.events,
            "sessions": args.sessions,
            "n": args.n,
            "pages": args.pages,
        },
        "stores": {},
    }
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox"])  # fmt: skip
        try:
            for kind in args.stores.split(","):
                result["stores"][kind] = run_store(kind, args, browser)
        finally:
            browser.close()
    result["host"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    write_result(args.out, result)


if __name__ == "__main__":
    main()
