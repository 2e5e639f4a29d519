"""The tally of timeline events into usage cells: one implementation for the rollup job (an hour
at a time, rollups.py) and for the console's reads of raw events (sub-hour buckets, the hours not
rolled up yet), so that a figure read from rollups is the figure raw events give.

A cell is one bucket of one (tenant, scenario): its events, tool calls, failures by class, a
latency histogram of the tool calls' ``duration_ms``, and the seconds its sandboxes ran and
stayed paused inside the bucket.

Failures: a ``tool_call`` with an error counts under its error's class (``code: message`` errors
by code, anything else as ``error``); ``failure`` and ``sandbox_failed`` events under their kind.

Sandbox spans, per session: running from a start (``STARTS``, with a sandbox id) to the next stop
(``STOPS``: a pause, reclaim, replacement, failure, orphan kill, a kill from the console or
the session's close); paused from ``sandbox_paused`` to the next start or stop. A span open at
a bucket's edge is split there, one still open at the end of the tallied range ends with it.

Latency histogram: log-spaced buckets of ratio ``GAMMA`` (1.04); key ``k`` holds durations in
[GAMMA**k, GAMMA**(k+1)) ms and reads back as its geometric middle, so a percentile read from it
is within 2% of the duration it stands for (sqrt(1.04) - 1 = 1.98%). Keys are strings, as JSON
keeps them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

HOUR = 3600
DAY = 86400
GAMMA = 1.04
LOG_GAMMA = math.log(GAMMA)
MIN_MS = 0.001  # durations below (0 included) go to this one's bucket

FAILURE_KINDS = ("failure", "sandbox_failed")
STARTS = ("sandbox_created", "sandbox_adopted", "sandbox_resumed")
PAUSE = "sandbox_paused"
STOPS = (
    PAUSE,
    "sandbox_reclaimed",
    "sandbox_replaced",
    "sandbox_failed",
    "sandbox_orphan_killed",
    "sandbox_killed",  # from the console
    "session_closed",
)
LIFECYCLE = STARTS + STOPS

Group = tuple[str, str | None]  # (tenant, scenario)


def error_class(error: str) -> str:
    """``code: message`` errors (the gateway's) by code; anything else as one class."""
    return head_class(error.split(":", 1)[0])


def head_class(head: str) -> str:
    """The class of an error from the text before its first colon."""
    head = head.strip()
    return head if head and len(head) <= 40 and " " not in head else "error"


def latency_key(ms: float) -> int:
    """(What rollups.py's SQL computes for each tool call.)"""
    return math.floor(math.log(max(ms, MIN_MS)) / LOG_GAMMA)


def latency_value(key: str) -> float:
    return float(GAMMA ** (int(key) + 0.5))


def percentile(hist: dict[str, int], q: float) -> float | None:
    """The duration of rank ``round(q * (n - 1))`` (0-based, as the exact p95 was taken), read
    back from its histogram bucket."""
    n = sum(hist.values())
    if not n:
        return None
    rank = round(q * (n - 1))
    seen = 0
    for key in sorted(hist, key=int):
        seen += hist[key]
        if seen > rank:
            return round(latency_value(key), 2)
    raise AssertionError("unreachable: the ranks add up to n")


@dataclass(slots=True)
class Cell:
    events: int = 0
    tool_calls: int = 0
    failures: dict[str, int] = field(default_factory=dict)  # class -> count
    latency: dict[str, int] = field(default_factory=dict)  # latency_key -> count
    running_s: float = 0.0
    paused_s: float = 0.0

    def add(self, other: Cell) -> None:
        self.events += other.events
        self.tool_calls += other.tool_calls
        merge(self.failures, other.failures)
        merge(self.latency, other.latency)
        self.running_s += other.running_s
        self.paused_s += other.paused_s

    def __bool__(self) -> bool:
        return bool(self.events or self.running_s or self.paused_s)


def merge(into: dict[str, int], other: dict[str, int]) -> None:
    for k, n in other.items():
        into[k] = into.get(k, 0) + n


def total(cells: Iterable[Cell]) -> Cell:
    out = Cell()
    for c in cells:
        out.add(c)
    return out


class Tally:
    """Cells of buckets ``i`` = [origin + i*step, origin + (i+1)*step), ``n`` of them (the last
    one open-ended), per group. Fed by counts (``count``: the database's GROUP BY, rollups.py),
    cells tallied earlier (``add``: rollup rows), and for the spans ``begin`` (the sessions'
    sandbox states at a moment), lifecycle events in time order (``event``), and ``end``."""

    def __init__(self, origin: float, step: float, n: int = 1) -> None:
        self.origin, self.step, self.n = origin, step, n
        self.cells: dict[Group, list[Cell]] = {}
        # (tenant, session) -> (paused?, since, group)
        self.spans: dict[tuple[str, str], tuple[bool, float, Group]] = {}

    def row(self, group: Group) -> list[Cell]:
        cells = self.cells.get(group)
        if cells is None:
            cells = self.cells[group] = [Cell() for _ in range(self.n)]
        return cells

    def clamp(self, i: int) -> int:
        return min(max(i, 0), self.n - 1)

    def index(self, at: float) -> int:
        return self.clamp(math.floor((at - self.origin) / self.step))

    def add(self, group: Group, at: float, cell: Cell) -> None:
        """A cell tallied elsewhere (a rollup row starting at ``at``)."""
        self.row(group)[self.index(at)].add(cell)

    def count(
        self, group: Group, i: int, kind: str, key: int | None, head: str | None, n: int
    ) -> None:
        """``n`` events of ``kind`` in bucket ``i``; a tool call's with its latency key and its
        error's head (the text before its first colon) or None."""
        c = self.row(group)[self.clamp(i)]
        c.events += n
        if kind == "tool_call":
            c.tool_calls += n
            if key is not None:
                k = str(key)
                c.latency[k] = c.latency.get(k, 0) + n
            if head is not None:
                k = head_class(head)
                c.failures[k] = c.failures.get(k, 0) + n
        elif kind in FAILURE_KINDS:
            c.failures[kind] = c.failures.get(kind, 0) + n

    def begin(self, at: float, states: Iterable[tuple[str, str, str | None, bool]]) -> None:
        """Spans open at ``at``: (tenant, session, scenario, paused?) of each session with a
        sandbox running or paused then."""
        self.spans = {(t, s): (paused, at, (t, sc)) for t, s, sc, paused in states}

    def end(self, at: float) -> None:
        for key in list(self.spans):
            self._close(key, at)

    def event(
        self, tenant: str, scenario: str | None, session: str, kind: str, at: float, sandbox: Any
    ) -> None:
        """A lifecycle event (``LIFECYCLE``), in time order: the spans it starts and ends."""
        key = (tenant, session)
        span = self.spans.get(key)
        if kind in STARTS:
            if sandbox is None or (span is not None and not span[0]):
                return  # no sandbox named, or running already
            paused = False
        elif kind == PAUSE:
            if span is not None and span[0]:
                return  # paused already
            paused = True
        else:
            if span is not None:
                self._close(key, at)
            return
        if span is not None:
            self._close(key, at)
        self.spans[key] = (paused, at, (tenant, scenario))

    def _close(self, key: tuple[str, str], at: float) -> None:
        paused, since, group = self.spans.pop(key)
        cells = self.row(group)
        i = self.index(since)
        while since < at:
            edge = self.origin + (i + 1) * self.step if i + 1 < self.n else at
            upto = min(edge, at)
            if paused:
                cells[i].paused_s += upto - since
            else:
                cells[i].running_s += upto - since
            since, i = upto, i + 1
