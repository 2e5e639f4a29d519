"""Prometheus metrics of ``sandhold serve`` (``GET /metrics``), with the official client library.

Each service has a registry of its own (never the library's global one: tests run several
servers in one process). Latencies are histograms observed by the service's lifecycle calls;
everything else is computed at scrape time by ``Collector``, on a runtime worker thread:

- sandboxes by state, template and team, and their summed disk budgets, from the records
  (``state.json``) read directly: one small JSON read per sandbox, no liveness check (a sandbox
  whose agent died shows as running until the service's next read of it marks it failed, within
  ``lifecycle_interval_s``) and no schema validation; the runtime's own listing costs ~10 times
  as much (bench/metrics_bench.py);
- OOM kills of processes inside sandboxes, from each live sandbox's memory cgroup;
- egress decisions, by tailing the egress daemon's audit log (audit.py) from where the last
  scrape stopped.

Labels are bounded: ``team`` by the configured API keys' teams, ``template`` by the templates in
the store, the rest by fixed sets; never a sandbox id, a session or a metadata value. The list
and the reasons are in docs/observability.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector as BaseCollector

from sandhold.audit import egress_dir
from sandhold.runtime import cgroups
from sandhold.runtime.pool import POOL_KEY
from sandhold.service.metrics import Failures, suspend_gauge
from sandhold.service.pooler import pool_metrics
from sandhold.service.records import LEGACY_RECORD_KEY, RECORD_KEY

if TYPE_CHECKING:
    from sandhold.config import Settings
    from sandhold.runtime.records import SandboxInfo
    from sandhold.runtime.runtime import Runtime

# No ``*_created`` samples (the process's start time, per series): noise on every histogram.
disable_created_metrics()

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
CREATE_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
LIFECYCLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
STARTS = ("cold", "warm", "pool", "snapshot", "fork")
EGRESS_KINDS = ("http", "connect", "mitm", "dns")  # docs/egress.md, "Audit log"
EGRESS_DECISIONS = ("allow", "deny")
EGRESS_READ_MAX = 64 << 20  # bytes of audit log one scrape reads at most (the rest: next time)
# A sample whose value is a whole number, written by the library as "1.0": written as "1".
_WHOLE = re.compile(rb"^([^#\n][^\n]* -?\d+)\.0$", re.M)


def state_of(state: str, suspended: str | None) -> str:
    """The ``state`` label: the record's state, a paused one by where its memory is."""
    if state == "paused" and suspended:
        return f"paused_{suspended}"  # paused_disk (CRIU image), paused_filesystem (none)
    return state


class EgressTail:
    """``sandhold_egress_decisions_total``: the egress audit log's records (one JSON line each,
    a file per UTC day) counted by kind and decision, read on from where the last read stopped.
    Only records written after this process started count (as with the failures counter)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.counts: Counter[tuple[str, str]] = Counter()
        self._file = ""  # the day file being read, and how far
        self._offset = 0
        self._lock = threading.Lock()
        files = self._files()
        if files:
            self._file = files[-1]
            with contextlib.suppress(OSError):
                self._offset = os.path.getsize(self.dir / self._file)

    def _files(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.dir) if n.endswith(".jsonl"))
        except OSError:
            return []

    def poll(self) -> None:
        with self._lock:
            budget = EGRESS_READ_MAX
            for name in self._files():
                if name < self._file or budget <= 0:
                    continue
                if name != self._file:
                    self._file, self._offset = name, 0
                try:
                    with open(self.dir / name, "rb") as f:
                        f.seek(self._offset)
                        data = f.read(budget)
                except OSError:
                    continue
                end = data.rfind(b"\n") + 1  # whole lines only: a partial one is read next time
                self._offset += end
                budget -= end
                for line in data[:end].splitlines():
                    self._count(line)

    def _count(self, line: bytes) -> None:
        try:
            rec = json.loads(line)
            kind, decision = rec.get("kind"), rec.get("decision")
        except (ValueError, AttributeError):
            return
        self.counts[
            (
                kind if kind in EGRESS_KINDS else "other",
                decision if decision in EGRESS_DECISIONS else "other",
            )
        ] += 1


class OomKills:
    """``sandhold_oom_kills_total``: processes the kernel's OOM killer ended inside sandboxes
    (their memory limit), read from each live sandbox's memory cgroup; a killed sandbox's last
    read count is kept. Kills in a sandbox that went between two scrapes are not seen."""

    def __init__(self, cgroup_group: str) -> None:
        self.group = cgroup_group
        self._last: dict[str, int] = {}
        self._gone = 0
        self._lock = threading.Lock()

    def read(self, sandbox_ids: Iterable[str]) -> int:
        now: dict[str, int] = {}
        for sid in sandbox_ids:
            try:
                now[sid] = cgroups.group(sid, self.group).oom_kills()
            except (OSError, KeyError, ValueError):
                continue
        with self._lock:
            self._gone += sum(n for sid, n in self._last.items() if sid not in now)
            self._last = now
            return self._gone + sum(now.values())


class ServiceMetrics:
    """The registry of one service: its histograms, observed by ``created`` and ``timed``, and
    the collector of everything computed at scrape. ``enabled=False`` (setting
    ``server_metrics``) observes nothing and serves only ``sandhold_suspend_to_disk``.
    ``suspends_to_disk`` tells whether paused sandboxes are suspended to disk here (asked at
    each scrape: the suspender decides)."""

    def __init__(
        self,
        runtime: Runtime,
        settings: Settings,
        failures: Failures,
        suspends_to_disk: Callable[[], bool],
    ) -> None:
        self.runtime = runtime
        self.settings = settings
        self.failures = failures
        self.suspends_to_disk = suspends_to_disk
        self.enabled = settings.server_metrics
        self.registry = CollectorRegistry(auto_describe=True)
        self.create_seconds = Histogram(
            "sandhold_create_duration_seconds",
            "Creates of sandboxes, from the request's validation to the agent answering (and "
            "the template's start command ready), by where the sandbox started from.",
            ["start"],
            buckets=CREATE_BUCKETS,
            registry=self.registry,
        )
        self.lifecycle_seconds = Histogram(
            "sandhold_lifecycle_duration_seconds",
            "Lifecycle operations on sandboxes by operation (pause, resume, restore, suspend, "
            "kill) and mode (memory, filesystem, disk; kill: the state it was in).",
            ["operation", "mode"],
            buckets=LIFECYCLE_BUCKETS,
            registry=self.registry,
        )
        for start in STARTS:  # every series present from the start, at 0
            self.create_seconds.labels(start)
        self.oom = OomKills(runtime.host.cgroup_group)
        self.egress = EgressTail(egress_dir(settings.data_dir))
        self.registry.register(Collector(self))

    def created(self, info: SandboxInfo, seconds: float) -> None:
        if self.enabled:
            start = info.started_from or "cold"
            self.create_seconds.labels(start if start in STARTS else "cold").observe(seconds)

    @contextlib.contextmanager
    def timed(self, operation: str, mode: str) -> Iterator[None]:
        """Observe the block's duration if it completes (a refused or failed call is not)."""
        t0 = time.perf_counter()
        yield
        if self.enabled:
            self.lifecycle_seconds.labels(operation, mode).observe(time.perf_counter() - t0)

    def exposition(self) -> bytes:
        """The text format 0.0.4, whole numbers without ".0" (readers of the hand-written text
        this replaces match integers: the gateway's e2b provider reads the suspend gauge so)."""
        if not self.enabled:
            reg = CollectorRegistry(auto_describe=False)
            reg.register(_Static([suspend_gauge(self.suspends_to_disk())]))
            return _WHOLE.sub(rb"\1", generate_latest(reg))
        return _WHOLE.sub(rb"\1", generate_latest(self.registry))


class _Static(BaseCollector):
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self.metrics


class Collector(BaseCollector):
    """What is computed at each scrape (see the module's docstring)."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self.m = metrics

    def describe(self) -> Iterable[Metric]:
        return []  # unchecked names: the families below are all ours

    def collect(self) -> Iterable[Metric]:
        m = self.m
        s = m.settings
        counts: Counter[tuple[str, str, str]] = Counter()
        budget, live = 0, []
        for rec in records(m.runtime.sandboxes_dir):
            extra = rec.get("extra") or {}
            if POOL_KEY in extra:
                continue  # booted ahead, nobody's yet: sandhold_pool_ready
            life = extra.get(RECORD_KEY) or extra.get(LEGACY_RECORD_KEY) or {}
            state = state_of(str(rec.get("state")), rec.get("suspended"))
            counts[(state, str(rec.get("template")), str(life.get("owner", "")))] += 1
            budget += ((rec.get("spec") or {}).get("limits") or {}).get("disk_mb") or 0
            if state in ("running", "paused"):
                live.append(str(rec.get("id")))
        g = GaugeMetricFamily(
            "sandhold_sandboxes",
            "Sandboxes on this server by state (running, paused: in memory, paused_disk: "
            "suspended to a CRIU image, paused_filesystem: files only, failed: its agent died), "
            "template and team (the owner); pooled ones not yet handed out are not counted.",
            labels=["state", "template", "team"],
        )
        for (state, template, team), n in sorted(counts.items()):
            g.add_metric([state, template, team], n)
        yield g
        yield GaugeMetricFamily(
            "sandhold_sandbox_disk_budget_bytes",
            "The disk budgets (disk_mb) of the sandboxes on this server, summed.",
            value=budget << 20,
        )
        st = os.statvfs(s.data_dir)
        yield GaugeMetricFamily(
            "sandhold_data_disk_used_bytes",
            "Bytes used on the filesystem of the data directory (data_dir).",
            value=(st.f_blocks - st.f_bfree) * st.f_frsize,
        )
        yield GaugeMetricFamily(
            "sandhold_data_disk_total_bytes",
            "Size of the filesystem of the data directory (data_dir).",
            value=st.f_blocks * st.f_frsize,
        )
        yield CounterMetricFamily(
            "sandhold_oom_kills",
            "Processes the OOM killer ended inside sandboxes (their memory limit), since this "
            "server started; an agent killed so also counts in sandhold_sandboxes_failed_total.",
            value=m.oom.read(live),
        )
        yield m.failures.metric()
        m.egress.poll()
        e = CounterMetricFamily(
            "sandhold_egress_decisions",
            "Egress connections, requests and DNS questions of sandboxes judged by the egress "
            "proxy since this server started (its audit log), by kind and decision.",
            labels=["kind", "decision"],
        )
        for kind in (*EGRESS_KINDS, "other"):
            for decision in (*EGRESS_DECISIONS, "other"):
                n = m.egress.counts.get((kind, decision), 0)
                if n or (decision != "other" and kind != "other"):
                    e.add_metric([kind, decision], n)
        yield e
        yield suspend_gauge(m.suspends_to_disk())
        yield from pool_metrics(m.runtime.pools, s.pool_sizes)


def records(sandboxes_dir: Path) -> Iterator[dict[str, Any]]:
    """Each sandbox's record as stored, without its validation (a half-written or removed
    one is skipped: it is a create or a kill in progress)."""
    try:
        entries = list(os.scandir(sandboxes_dir))
    except FileNotFoundError:
        return
    for entry in entries:
        try:
            with open(os.path.join(entry.path, "state.json"), "rb") as f:
                rec = json.loads(f.read())
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict):
            yield rec
