"""Usage over time for the console's charts: per bucket, per (tenant, scenario) and in total.

``series(store, tenant, scenario, since, until)`` (``None``: every tenant, every scenario) picks
the bucket from the range's length, edges aligned to UTC (multiples of the bucket since the
epoch): up to 1 h, 1-minute buckets; up to 6 h, 5 minutes; up to 2 days, hourly; up to 10 days,
6-hourly; longer, daily. The first bucket starts at or before ``since`` (the answer's ``since``
is its start); the last one holds ``until``. Nothing is counted after ``until`` or after now.

Whole rolled-up hours (and days, with daily buckets) are read from the rollups
(store/rollups.py); sub-hour buckets, the range's edges and the hours not rolled up yet from raw
events, through the same tally (store/tally.py), so that both give the same figures.

The answer::

    {"since": <first bucket's start>, "until": until, "bucket_s": 3600,
     "buckets": [<start of each bucket, epoch s>, ...],
     "total": {<metric>: [<value per bucket>, ...], ...},
     "groups": [{"tenant": "acme", "scenario": "grading" | null, <metric>: [...], ...}, ...]}

Metrics, each a list with one value per bucket:

- ``events``: timeline events; ``tool_calls``: tool calls;
- ``failures``: failed tool calls and failure events; ``failure_classes``: ``{class: [...]}``
  (the failures by class, as ``stats`` gives them);
- ``p50_ms``, ``p95_ms``: tool-call latency from the rollups' histograms, within 2% of the
  exact value (``null``: no tool call in the bucket);
- ``sandbox_hours``: sandboxes' running time in the bucket;
- ``live``, ``paused``: the time-averaged number of running and of paused sandboxes over the
  bucket's part that has passed (seconds running or paused / the bucket's seconds).
"""

from __future__ import annotations

import math
import time
from typing import Any

from sandhold.store.db import Store
from sandhold.store.rollups import floor_to, usage
from sandhold.store.tally import DAY, HOUR, Cell, Group, percentile, total

# (longest range, bucket) in seconds; longer ranges than the last get daily buckets
STEPS = ((HOUR, 60), (6 * HOUR, 300), (2 * DAY, HOUR), (10 * DAY, 6 * HOUR))


def bucket_for(span_s: float) -> int:
    return next((step for longest, step in STEPS if span_s <= longest), DAY)


def series(
    store: Store,
    tenant: str | None,
    scenario: str | None,
    since: float,
    until: float,
    now: float | None = None,
) -> dict[str, Any]:
    now = time.time() if now is None else now
    step = bucket_for(until - since)
    start = floor_to(since, step)
    n = max(1, math.ceil((until - start) / step))
    edges = [float(start + i * step) for i in range(n)]
    hi = max(start, min(until, now))
    cells = usage(store.engine, start, step, n, hi, tenant, scenario, days=step % DAY == 0).cells
    seconds = [max(0.0, min(e + step, hi) - e) for e in edges]
    empty = [Cell() for _ in edges]
    totals = [total(c[i] for c in cells.values()) for i in range(n)] if cells else empty
    return {
        "since": start,
        "until": until,
        "bucket_s": step,
        "buckets": [int(e) for e in edges],
        "total": columns(totals, seconds),
        "groups": [
            {"tenant": g[0], "scenario": g[1], **columns(cells[g], seconds)} for g in ordered(cells)
        ],
    }


def ordered(groups: Any) -> list[Group]:
    return sorted(groups, key=lambda g: (g[0], g[1] or ""))


def columns(cells: list[Cell], seconds: list[float]) -> dict[str, Any]:
    classes = sorted({k for c in cells for k in c.failures})
    return {
        "events": [c.events for c in cells],
        "tool_calls": [c.tool_calls for c in cells],
        "failures": [sum(c.failures.values()) for c in cells],
        "failure_classes": {k: [c.failures.get(k, 0) for c in cells] for k in classes},
        "p50_ms": [percentile(c.latency, 0.5) for c in cells],
        "p95_ms": [percentile(c.latency, 0.95) for c in cells],
        "sandbox_hours": [round(c.running_s / 3600, 4) for c in cells],
        "live": [_per(c.running_s, s) for c, s in zip(cells, seconds, strict=True)],
        "paused": [_per(c.paused_s, s) for c, s in zip(cells, seconds, strict=True)],
    }


def _per(part_s: float, of_s: float) -> float:
    return round(part_s / of_s, 3) if of_s else 0.0
