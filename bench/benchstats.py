"""What every benchmark script shares: percentiles, summaries, PSS of a set of processes.

The scripts run as ``python bench/<name>.py``, so this module is importable as ``benchstats``."""

from __future__ import annotations

import json
import statistics
from pathlib import Path


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))], 2)


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": pct(values, 50),
        "p95": pct(values, 95),
        "min": round(min(values), 2),
        "mean": round(statistics.fmean(values), 2),
        "n": len(values),
    }


def pss_kib(pids: list[int]) -> int:
    """Proportional set size of these processes: shared pages are split among their users."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def smaps_kib(pids: list[int]) -> dict[str, int]:
    """PSS, USS (Private_Clean + Private_Dirty: pages no other process maps) and RSS of these
    processes, in KiB, from one read of each one's smaps_rollup."""
    total = {"pss": 0, "uss": 0, "rss": 0}
    keys = {"Pss:": "pss", "Private_Clean:": "uss", "Private_Dirty:": "uss", "Rss:": "rss"}
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key = keys.get(line.split(maxsplit=1)[0] if line else "")
            if key:
                total[key] += int(line.split()[1])
    return total


def write_result(path: str, result: dict[str, object]) -> None:
    """Write the machine-readable result (bench/results/<name>.json) and echo it."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=2)
    out.write_text(text + "\n")
    print(text)


def destroy_data_dir(data_dir: Path) -> None:
    """Kill every sandbox a bench left on ``data_dir``, its cgroups' parent, then the dir."""
    import shutil

    from sandhold.config import Settings
    from sandhold.runtime import cgroups
    from sandhold.runtime.runtime import Runtime

    settings = Settings(data_dir=data_dir)
    rt = Runtime(settings).open()
    for info in rt.list():
        rt.kill(info.id)
    cgroups.remove_parent(settings.cgroup_group)
    shutil.rmtree(data_dir, ignore_errors=True)
