"""Metrics samples of sandboxes, and the count of sandboxes that failed. History is kept in
memory only (it is not lifecycle state), so CPU percentages are relative to the previous sample
or to the start; the count is of failures this process saw happen since it started.

A sample is taken when asked (E2B's metrics calls, the console) and, with
``server_console_sample_interval_s``, of every running sandbox on that interval (``sampling``),
so a sandbox's history grows while it runs: at most ``HISTORY`` samples per sandbox, forgotten
once the sandbox is gone."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from sandhold.errors import SandholdError
from sandhold.runtime.records import SandboxInfo, Usage
from sandhold.service.records import Sandbox
from sandhold.service.timers import Periodic

log = logging.getLogger(__name__)

HISTORY = 256


@dataclass(frozen=True)
class Sample:
    at: float
    cpu_count: int
    cpu_used_pct: float
    mem_used: int
    mem_total: int
    mem_cache: int
    disk_used: int
    disk_total: int
    cpu_seconds: float  # cumulative, for the next sample's percentage


class Samples:
    def __init__(self, disk_total: int, read: Callable[[str], Awaitable[Usage]]) -> None:
        self.disk_total = disk_total
        self._read = read  # a sandbox's usage now (SandboxNotFound: it is gone)
        self._history: dict[str, deque[Sample]] = {}

    async def take(self, sandbox_id: str, started_at: float) -> Sample:
        """One sample of a sandbox now, added to its history."""
        usage = await self._read(sandbox_id)
        return self.add(sandbox_id, started_at, usage, time.time())

    def add(self, sandbox_id: str, started_at: float, usage: Usage, now: float) -> Sample:
        history = self._history.setdefault(sandbox_id, deque(maxlen=HISTORY))
        prev_t, prev_cpu = started_at, 0.0
        if history:
            prev_t, prev_cpu = history[-1].at, history[-1].cpu_seconds
        elapsed = max(now - prev_t, 1e-3)
        pct = (usage.cpu_seconds - prev_cpu) / elapsed / max(usage.cpu_count, 1e-3) * 100
        sample = Sample(
            at=now,
            cpu_count=max(1, math.ceil(usage.cpu_count)),
            cpu_used_pct=round(min(max(pct, 0.0), 100.0), 2),
            mem_used=usage.memory_bytes,
            mem_total=usage.memory_limit_bytes,
            mem_cache=usage.memory_cache_bytes,
            disk_used=usage.disk_bytes,
            disk_total=usage.disk_limit_bytes or self.disk_total,
            cpu_seconds=usage.cpu_seconds,
        )
        history.append(sample)
        return sample

    def history(self, sandbox_id: str, start: int | None, end: int | None) -> list[Sample]:
        return [
            s
            for s in self._history.get(sandbox_id, ())
            if (start is None or int(s.at) >= start) and (end is None or int(s.at) <= end)
        ]

    def forget(self, sandbox_id: str) -> None:
        self._history.pop(sandbox_id, None)

    def keep_only(self, ids: set[str]) -> None:
        for gone in self._history.keys() - ids:
            self._history.pop(gone, None)


def sampling(
    interval_s: float, listing: Callable[[], Awaitable[list[Sandbox]]], samples: Samples
) -> list[Periodic]:
    """The job that samples every running sandbox each ``interval_s`` (none for 0), and forgets
    the history of sandboxes no longer listed (killed by another process, say). One sandbox at
    a time: the job never takes more than one of the runtime's threads."""
    if interval_s <= 0:
        return []

    async def tick() -> None:
        everything = await listing()
        samples.keep_only({s.id for s in everything})
        for sbx in everything:
            if not sbx.running:
                continue  # a paused sandbox uses no CPU; its last samples stay
            try:
                await samples.take(sbx.id, sbx.info.created_at)
            except (SandholdError, OSError) as e:  # gone or going meanwhile
                log.debug("no sample of sandbox %s: %s", sbx.id, e)

    return [Periodic(tick, interval_s, "sandhold-sample")]


# Why a sandbox failed, as a bounded label: read from the runtime's text (records.py: failure).
FAILURE_REASONS = ("oom", "signal", "exit", "unknown")


def failure_reason(failure: str | None) -> str:
    text = failure or ""
    if "OOM kill" in text:
        return "oom"
    if "(signal " in text:
        return "signal"
    if "exit status" in text:
        return "exit"
    return "unknown"  # e.g. its agent died while no server of ours was its parent (a reboot)


class Failures:
    """``sandhold_sandboxes_failed_total{reason}``: sandboxes whose agent died, each counted once
    by the first of our reads that sees it failed. Only failures marked since ``since`` count:
    one marked before this process started was counted (or missed) by another."""

    def __init__(self, since: float) -> None:
        self.since = since
        self.counts = dict.fromkeys(FAILURE_REASONS, 0)
        self._seen: set[str] = set()  # failed sandboxes not yet killed: bounded by the host's
        self._lock = threading.Lock()  # observed from the service's runtime threads

    def observe(self, info: SandboxInfo) -> None:
        if info.state != "failed":
            return
        with self._lock:
            if info.id in self._seen:
                return
            self._seen.add(info.id)
            if info.failed_at is not None and info.failed_at >= self.since:
                self.counts[failure_reason(info.failure)] += 1

    def forget(self, sandbox_id: str) -> None:
        with self._lock:
            self._seen.discard(sandbox_id)

    def prune(self, gone: Callable[[str], bool]) -> None:
        """Forget the ones gone (killed by another process, say)."""
        with self._lock:
            self._seen = {i for i in self._seen if not gone(i)}

    def metric(self) -> CounterMetricFamily:
        with self._lock:
            counts = dict(self.counts)
        c = CounterMetricFamily(
            "sandhold_sandboxes_failed",
            "Sandboxes whose agent died (marked failed, kept until killed), by reason.",
            labels=["reason"],
        )
        for reason, n in counts.items():
            c.add_metric([reason], n)
        return c


def suspend_gauge(enabled: bool) -> GaugeMetricFamily:
    """``sandhold_suspend_to_disk``: whether this server suspends paused sandboxes to disk (the
    gateway's e2b provider reads it as its ``suspends_to_disk`` capability)."""
    return GaugeMetricFamily(
        "sandhold_suspend_to_disk",
        "Whether paused sandboxes are suspended to disk after suspend_after_s (1: CRIU usable "
        "and suspend_after_s >= 0).",
        value=int(enabled),
    )
