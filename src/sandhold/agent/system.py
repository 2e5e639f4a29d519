"""``GET /health``, ``GET /envs`` and ``GET /metrics`` (numbers as seen inside the sandbox:
its cgroup when visible, else /proc and statvfs of /)."""

from __future__ import annotations

import os
import time

from . import aio
from .config import AgentConfig, identity_env
from .http import Request, Response

CGROUP = "/sys/fs/cgroup"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    for line in (_read("/proc/meminfo") or "").splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[name] = int(parts[0]) * 1024
    return out


def _cgroup_int(name: str) -> int | None:
    raw = _read(f"{CGROUP}/{name}")
    if raw is None:
        return None
    raw = raw.strip()
    return int(raw) if raw.isdigit() else None


def _cpu_sample() -> tuple[float, float] | None:
    """(busy, total) CPU seconds: from the cgroup if it is ours to see, else /proc/stat."""
    stat = _read(f"{CGROUP}/cpu.stat")
    if stat is not None:
        for line in stat.splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6, time.monotonic() * _cpu_count()
    first = (_read("/proc/stat") or "").partition("\n")[0].split()
    if len(first) < 5 or first[0] != "cpu":
        return None
    ticks = [int(x) for x in first[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    hz = os.sysconf("SC_CLK_TCK") or 100
    total = sum(ticks[:8]) / hz
    return total - idle / hz, total


def _cpu_count() -> int:
    count = len(os.sched_getaffinity(0)) or os.cpu_count() or 1
    quota = (_read(f"{CGROUP}/cpu.max") or "").split()
    if len(quota) == 2 and quota[0].isdigit() and quota[1].isdigit() and int(quota[1]) > 0:
        count = min(count, max(1, -(-int(quota[0]) // int(quota[1]))))
    return count


class SystemHandler:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self._last_cpu: tuple[float, float] | None = None

    async def health(self, req: Request, resp: Response) -> None:
        await resp.send(204)

    async def envs(self, req: Request, resp: Response) -> None:
        await resp.send_json(200, {**identity_env(), **self.config.env})

    async def _cpu_pct(self) -> float:
        prev = self._last_cpu
        if prev is None:
            prev = _cpu_sample()
            await aio.sleep(0.1)
        cur = _cpu_sample()
        self._last_cpu = cur
        if prev is None or cur is None or cur[1] <= prev[1]:
            return 0.0
        pct = 100.0 * (cur[0] - prev[0]) / (cur[1] - prev[1])
        return round(min(max(pct, 0.0), 100.0), 2)

    async def metrics(self, req: Request, resp: Response) -> None:
        mem = _meminfo()
        total = mem.get("MemTotal", 0)
        used = total - mem.get("MemAvailable", mem.get("MemFree", 0))
        cache = mem.get("Cached", 0)
        limit, current = _cgroup_int("memory.max"), _cgroup_int("memory.current")
        if current is not None:
            total = min(total, limit) if limit else total
            used = current
            for line in (_read(f"{CGROUP}/memory.stat") or "").splitlines():
                if line.startswith("file "):
                    cache = int(line.split()[1])
                    used = max(0, current - cache)
        try:
            fs = os.statvfs("/")
            disk_total = fs.f_blocks * fs.f_frsize
            disk_used = (fs.f_blocks - fs.f_bfree) * fs.f_frsize
        except OSError:
            disk_total = disk_used = 0
        await resp.send_json(
            200,
            {
                "ts": int(time.time()),
                "cpu_count": _cpu_count(),
                "cpu_used_pct": await self._cpu_pct(),
                "mem_total": total,
                "mem_used": used,
                "mem_cache": cache,
                "mem_total_mib": total >> 20,
                "mem_used_mib": used >> 20,
                "disk_used": disk_used,
                "disk_total": disk_total,
            },
        )
