"""Cost growth: how create, list and memory per sandbox move as live sandboxes pile up, through
the official e2b SDK against one `sandhold serve` on a throw-away data dir under /var/tmp.

    .venv/bin/python bench/growth_bench.py [--levels 0,1,100,500,1000] [--n 10] [--lists 5]
                                           [--concurrency 4] [--out bench/results/growth.json]

At each level of live idle ``base`` sandboxes (grown to it by ``--concurrency`` async clients):
``Sandbox.create()`` latency (``--n`` extra sandboxes, each created and killed, each after a
bare ``python3 -c pass``, the floor whose drift between levels is the host's load, and a bare
``bwrap --unshare-all true``, whose new mount namespace copies the host's mount table),
``Sandbox.list()`` latency (paging through every sandbox, 100 a page: E2B's largest page), and
host memory per sandbox: PSS and USS (Private_Clean + Private_Dirty) of every process of every
sandbox, found through its cgroup, divided by their count, with the memory charged to their
cgroups and the host's MemTotal - MemAvailable growth since level 0. Before growing to a level it
checks that the sandboxes would fit in this host's memory and pids (what the last level
measured, times what is to come, must leave a reserve) and stops at the last level that fits,
saying why. Everything is killed at the end (through the API, then the runtime for anything
left), the cgroups and the data dir removed; leftover mounts and cgroups are counted in the
result. Times are milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from e2b import AsyncSandbox, Sandbox
from e2b.api.metadata import package_version

from benchstats import smaps_kib, summary, write_result
from e2b_bench import API_KEY, start_server
from sandhold.config import Settings
from sandhold.runtime import cgroups
from sandhold.runtime.runtime import Runtime

LIVE_TIMEOUT_S = 4 * 3600  # the live sandboxes must outlast the run
MEM_RESERVE_FRACTION = 0.2  # of MemTotal, left free after the next level
PIDS_RESERVE_FRACTION = 0.25  # of pid_max, left free after the next level


def meminfo_kib() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, value = line.split(":", 1)
        out[key] = int(value.split()[0])
    return out


def host_used_kib() -> int:
    m = meminfo_kib()
    return m["MemTotal"] - m["MemAvailable"]


def host_tasks() -> int:
    """Kernel scheduling entities (threads) on the host: /proc/loadavg's fourth field."""
    return int(Path("/proc/loadavg").read_text().split()[3].split("/")[1])


def threads(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


async def grow(to: int, have: list[str], concurrency: int) -> dict[str, object]:
    """Create sandboxes until ``have`` holds ``to`` ids, from ``concurrency`` async clients."""
    need = to - len(have)
    remaining = [need]
    latencies: list[float] = []
    errors: list[str] = []

    async def client() -> None:
        while remaining[0] > 0 and not errors:
            remaining[0] -= 1
            t = time.perf_counter()
            try:
                s = await AsyncSandbox.create(timeout=LIVE_TIMEOUT_S)
            except Exception as e:  # report where the host stops, not a traceback
                errors.append(f"{type(e).__name__}: {e}"[:300])
                return
            latencies.append((time.perf_counter() - t) * 1000)
            have.append(s.sandbox_id)

    t = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t
    return {"created": len(latencies), "elapsed_s": round(elapsed, 1),
            "creates_per_s": round(len(latencies) / elapsed, 1) if elapsed > 0 else None,
            "create_latency_ms": summary(latencies) if latencies else None,
            "error": errors[0] if errors else None}  # fmt: skip


def list_all() -> tuple[float, int, int]:
    """(ms, sandboxes, pages) of one walk through every page of ``Sandbox.list()``."""
    t = time.perf_counter()
    paginator = Sandbox.list(limit=100)
    count = pages = 0
    while paginator.has_next:
        count += len(paginator.next_items())
        pages += 1
    return (time.perf_counter() - t) * 1000, count, pages


def memory(group: str, baseline_used_kib: int, server_pid: int) -> dict[str, object]:
    names = cgroups.list_names(group)
    pids: list[int] = []
    charged = 0
    for name in names:
        cg = cgroups.group(name, group)
        pids += cg.pids()
        charged += cg.usage().get("memory_bytes", 0)
    k = smaps_kib(pids)
    count = max(1, len(names))
    mib = lambda kib: round(kib / count / 1024, 2)  # noqa: E731
    return {
        "sandboxes": len(names),
        "processes": len(pids),
        "threads_per_sandbox": round(sum(threads(p) for p in pids) / count, 2),
        "pss_per_sandbox_mib": mib(k["pss"]),
        "uss_per_sandbox_mib": mib(k["uss"]),
        "rss_per_sandbox_mib": mib(k["rss"]),
        "cgroup_memory_per_sandbox_mib": round(charged / count / 2**20, 2),
        "host_used_growth_per_sandbox_mib": mib(host_used_kib() - baseline_used_kib),
        "server_pss_mib": round(smaps_kib([server_pid])["pss"] / 1024, 1),
    }


def fits(target: int, live: int, last: dict[str, object] | None) -> str | None:
    """Why growing from ``live`` to ``target`` sandboxes would not fit this host, or None."""
    more = target - live
    if more <= 0:
        return None
    per_mib = 16.0  # before anything is measured: more than a bare sandbox takes
    per_tasks = 4.0
    if last and last.get("sandboxes"):
        measured = [
            float(last[k]) for k in ("cgroup_memory_per_sandbox_mib", "pss_per_sandbox_mib")
        ]  # type: ignore[arg-type]
        per_mib = max(*measured, 1.0) * 1.25
        per_tasks = max(float(last["threads_per_sandbox"]), 1.0) + 1  # type: ignore[arg-type]
    m = meminfo_kib()
    need_kib = more * per_mib * 1024
    left_kib = m["MemAvailable"] - need_kib
    if left_kib < MEM_RESERVE_FRACTION * m["MemTotal"]:
        return (f"memory: {more} more sandboxes at ~{per_mib:.1f} MiB each need "
                f"{need_kib / 2**20:.1f} GiB of {m['MemAvailable'] / 2**20:.1f} GiB available, "
                f"leaving less than {MEM_RESERVE_FRACTION:.0%} of MemTotal")  # fmt: skip
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    threads_max = int(Path("/proc/sys/kernel/threads-max").read_text())
    cap = min(pid_max, threads_max)
    need_tasks = host_tasks() + more * per_tasks
    if need_tasks > (1 - PIDS_RESERVE_FRACTION) * cap:
        return (f"pids: {more} more sandboxes at ~{per_tasks:.0f} tasks each would bring the "
                f"host to {need_tasks:.0f} tasks of {cap} (pid_max / threads-max)")  # fmt: skip
    return None


PYTHON_PASS = ["/usr/bin/python3", "-c", "pass"]  # the load's floor
BWRAP_TRUE = ["bwrap", "--unshare-all", "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib64",
              "/lib64", "--symlink", "usr/lib", "/lib", "/usr/bin/true"]  # fmt: skip
# ... and a new mount namespace's: it copies the host's mount table, which every sandbox grows.


def floor_ms(argv: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(argv, check=True)
    return (time.perf_counter() - t) * 1000


def measure(n: int, lists: int, live: int) -> dict[str, object]:
    creates, kills, floors, bwraps = [], [], [], []
    for _ in range(n):
        floors.append(floor_ms(PYTHON_PASS))
        bwraps.append(floor_ms(BWRAP_TRUE))
        t = time.perf_counter()
        s = Sandbox.create(timeout=120)
        creates.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        s.kill()
        kills.append((time.perf_counter() - t) * 1000)
    walks = [list_all() for _ in range(lists)]
    seen = {c for _, c, _ in walks}
    return {
        "floor_python3_pass_ms": summary(floors),
        "floor_bwrap_true_ms": summary(bwraps),
        "create_ms": summary(creates),
        "kill_ms": summary(kills),
        "list_all_ms": summary([ms for ms, _, _ in walks]),
        "list_pages": walks[0][2],
        "list_counts_seen": sorted(seen),
        "list_count_ok": seen == {live},
    }


async def kill_all(ids: list[str], concurrency: int) -> float:
    queue = list(ids)
    t = time.perf_counter()

    async def client() -> None:
        while queue:
            sid = queue.pop()
            try:
                await AsyncSandbox.kill(sid)
            except Exception:  # the runtime kills what the API could not
                pass

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return time.perf_counter() - t


def cleanup(data: Path, proc: object, ids: list[str], concurrency: int) -> dict[str, object]:
    out: dict[str, object] = {}
    try:
        out["kill_all_via_api_s"] = round(asyncio.run(kill_all(ids, concurrency)), 1)
    except Exception as e:
        out["kill_all_via_api_error"] = str(e)[:300]
    proc.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
    try:
        proc.wait(60)  # type: ignore[attr-defined]
    except Exception:
        proc.kill()  # type: ignore[attr-defined]
    settings = Settings(data_dir=data)
    rt = Runtime(settings).open()
    left = rt.list()
    out["left_for_runtime_kill"] = len(left)
    for info in left:
        rt.kill(info.id)
    out["leftover_cgroups"] = len(cgroups.list_names(settings.cgroup_group))
    cgroups.remove_parent(settings.cgroup_group)
    out["leftover_mounts"] = sum(
        str(data) in line for line in Path("/proc/self/mountinfo").read_text().splitlines()
    )
    shutil.rmtree(data, ignore_errors=True)
    out["data_dir_removed"] = not data.exists()
    return out


def main() -> dict[str, object]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--levels", default="0,1,100,500,1000", help="live sandboxes, comma-separated")
    ap.add_argument("--n", type=int, default=10, help="creates (+ kills) measured per level")
    ap.add_argument("--lists", type=int, default=5, help="walks through the list per level")
    ap.add_argument("--concurrency", type=int, default=4, help="clients growing the live set")
    ap.add_argument("--out", default="bench/results/growth.json")
    args = ap.parse_args()
    levels = sorted({int(x) for x in args.levels.split(",") if x.strip()})

    data = Path(tempfile.mkdtemp(prefix="sandhold-growth-bench-", dir="/var/tmp"))
    data.chmod(0o755)
    log = Path(tempfile.gettempdir()) / "sandhold-growth-bench.log"
    proc, url = start_server(data, log)
    os.environ.update(E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=API_KEY,
                      NO_PROXY="127.0.0.1,localhost")  # fmt: skip
    os.environ.pop("E2B_DEBUG", None)
    group = Settings(data_dir=data).cgroup_group
    started = time.monotonic()
    result: dict[str, object] = {
        "host": {"kernel": platform.release(), "cpus": os.cpu_count(),
                 "mem_total_gib": round(meminfo_kib()["MemTotal"] / 2**20, 1),
                 "pid_max": int(Path("/proc/sys/kernel/pid_max").read_text()),
                 "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]},
        "sdk": f"e2b {package_version}",
        "args": {"levels": levels, "n": args.n, "lists": args.lists,
                 "concurrency": args.concurrency},
        "levels": [],
        "stopped": None,
    }  # fmt: skip
    ids: list[str] = []
    rows: list[dict[str, object]] = result["levels"]  # type: ignore[assignment]
    try:
        Sandbox.create(timeout=60).kill()  # warm-up: template, agent library copy
        time.sleep(1)
        baseline = host_used_kib()
        result["host"]["used_at_level_0_mib"] = round(baseline / 1024)  # type: ignore[index]
        last_mem: dict[str, object] | None = None
        for level in levels:
            why = fits(level, len(ids), last_mem)
            if why:
                result["stopped"] = {"before_level": level, "reason": why}
                break
            row: dict[str, object] = {"live": level}
            if level > len(ids):
                row["grow"] = asyncio.run(grow(level, ids, args.concurrency))
                if row["grow"]["error"]:  # type: ignore[index]
                    row["live"] = len(ids)
                    result["stopped"] = {"before_level": level, "reason": row["grow"]["error"]}  # type: ignore[index]
            time.sleep(3)  # the last creates' background work settles
            row["loadavg_1m"] = round(os.getloadavg()[0], 2)
            row["host_mounts"] = len(Path("/proc/self/mountinfo").read_text().splitlines())
            row["host_tasks"] = host_tasks()  # every sandbox's mounts and tasks, ours or not
            if ids:
                last_mem = row["memory"] = memory(group, baseline, proc.pid)
            row.update(measure(args.n, args.lists, len(ids)))
            rows.append(row)
            c, ls = row["create_ms"], row["list_all_ms"]
            print(f"level {row['live']}: create p50 {c['p50']} ms, list p50 {ls['p50']} ms, "  # type: ignore[index]
                  f"memory {row.get('memory')}", flush=True)  # fmt: skip
            write_result(args.out, result)  # what is measured so far survives a crash
            if result["stopped"]:
                break
    except BaseException as e:
        result["interrupted"] = f"{type(e).__name__}: {e}"[:300]
        raise
    finally:
        result["cleanup"] = cleanup(data, proc, ids, args.concurrency)
        result["cleanup"]["cgroup_group"] = group  # type: ignore[index]
        result["elapsed_s"] = round(time.monotonic() - started)
        result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        if result.get("interrupted"):
            write_result(args.out, result)
    base = next((r for r in rows if r["live"] == 0), rows[0] if rows else None)
    top = rows[-1] if rows else None
    if base and top and top is not base:
        p50 = lambda r, k: r[k]["p50"]  # noqa: E731
        result["ratio_top_to_first_level_p50"] = {
            "levels": [base["live"], top["live"]],
            "create": round(p50(top, "create_ms") / p50(base, "create_ms"), 2),
            **{
                f: round(p50(top, f"floor_{f}_ms") / p50(base, f"floor_{f}_ms"), 2)
                for f in ("python3_pass", "bwrap_true")
            },
            "list_all": round(p50(top, "list_all_ms") / p50(base, "list_all_ms"), 2),
        }
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
