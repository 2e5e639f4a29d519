"""Metrics samples of sandboxes. History is kept in memory only (it is not lifecycle state), so
CPU percentages are relative to the previous sample or to the start."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from sandhold.runtime.records import Usage

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
    def __init__(self, disk_total: int) -> None:
        self.disk_total = disk_total
        self._history: dict[str, deque[Sample]] = {}

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
