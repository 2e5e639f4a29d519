"""Runtime benchmarks on this host: create-to-ready, create-to-first-command, command round
trip, pause/resume, memory per idle sandbox and how many idle sandboxes fit, with the floors
measured in the same run.

    .venv/bin/python bench/runtime_bench.py [--n 30] [--idle 500] [--out bench/results/runtime.json]
    .venv/bin/python bench/runtime_bench.py --disk [--n 30]   # -> bench/results/runtime_disk.json
    .venv/bin/python bench/runtime_bench.py --isolation [--n 30]  # -> runtime_isolation.json

Prints one JSON document (and writes it to --out). Times are milliseconds. ``--disk`` measures
only the disk budget's cost: create, first command, a 256 MiB write and kill with the budget
(its own ext4 image on a loop device) against the same without, interleaved in one run;
``--isolation`` the same with disk budgets and per-sandbox uid ranges each turned off and both.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from benchstats import pct, pss_kib, summary, write_result
from sandhold.config import Settings
from sandhold.runtime import cgroups, disk
from sandhold.runtime.client import AgentClient
from sandhold.runtime.runtime import Runtime


async def comparison(rt: Runtime, n: int, variants: dict[str, dict[str, object]]) -> dict:
    """The same create -> command -> write -> kill with ``rt`` ("all": every isolation on) and
    with runtimes on the same data dir whose settings turn some off, rotating the order."""
    rts = {"all": rt} | {k: Runtime(rt.settings.model_copy(update=v)).open()
                         for k, v in variants.items()}  # fmt: skip
    names = ("create_to_ready_ms", "create_to_first_command_ms", "write_256mib_fsync_ms", "kill_ms")
    t: dict[str, dict[str, list[float]]] = {k: {m: [] for m in names} for k in rts}

    async def one(name: str) -> None:
        r, m = rts[name], t[name]
        t0 = time.perf_counter()
        info = r.create({})
        m["create_to_ready_ms"].append((time.perf_counter() - t0) * 1000)
        async with AgentClient(info.agent_socket) as c:
            await c.run(["/bin/true"])
            m["create_to_first_command_ms"].append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            await c.sh("dd if=/dev/zero of=/home/user/f bs=1M count=256 conv=fsync 2>/dev/null")
            m["write_256mib_fsync_ms"].append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        r.kill(info.id)
        m["kill_ms"].append((time.perf_counter() - t0) * 1000)

    order = list(rts)
    for name in order:  # warm every path
        await one(name)
    for k in t.values():
        for v in k.values():
            v.clear()
    for i in range(n):
        for name in order[i % len(order) :] + order[: i % len(order)]:
            await one(name)
    out: dict[str, object] = {k: {m: summary(v) for m, v in k_t.items()} for k, k_t in t.items()}
    out["ratio_p50_all_to"] = {
        k: {m: round(pct(t["all"][m], 50) / pct(t[k][m], 50), 2) for m in names} for k in variants
    }
    return out


async def disk_comparison(rt: Runtime, n: int) -> dict[str, object]:
    out = await comparison(rt, n, {"without_budget": {"disk_enforced": False}})
    out["steps_ms"] = disk_steps(rt, n)
    return out


def disk_steps(rt: Runtime, n: int) -> dict[str, object]:
    """What the budget adds to a create and a kill, step by step (2 GiB images)."""
    names = ("mkfs_ext4", "copy_formatted", "loop_and_mount", "unmount_and_detach")
    steps: dict[str, list[float]] = {k: [] for k in names}
    size = rt.settings.default_disk_mb << 20
    work = Path(tempfile.mkdtemp(dir=rt.settings.data_dir))
    for i in range(n):
        t0 = time.perf_counter()
        rt.disk._formatted(size + ((i + 1) << 20))  # a size not cached yet: mkfs.ext4
        steps["mkfs_ext4"].append((time.perf_counter() - t0) * 1000)
        d = work / str(i)
        d.mkdir()
        t0 = time.perf_counter()
        disk.copy_sparse(rt.disk._formatted(size), d / disk.IMAGE)
        steps["copy_formatted"].append((time.perf_counter() - t0) * 1000)
        (d / disk.MOUNT).mkdir()
        t0 = time.perf_counter()
        disk.mount_image(d / disk.IMAGE, d / disk.MOUNT, b"ext4", 0, disk.MOUNT_OPTS,
                         d / disk.DEVICE)  # fmt: skip
        steps["loop_and_mount"].append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        rt.disk.release(d)
        steps["unmount_and_detach"].append((time.perf_counter() - t0) * 1000)
    shutil.rmtree(work)
    return {k: summary(v) for k, v in steps.items()}


def timed_cmd(argv: list[str], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(argv, check=True)
        out.append((time.perf_counter() - t) * 1000)
    return out


async def main() -> dict[str, object]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--idle", type=int, default=500)
    ap.add_argument("--out", default=None)
    ap.add_argument("--disk", action="store_true", help="only the disk budget's cost")
    ap.add_argument(
        "--isolation",
        action="store_true",
        help="only the cost of disk budgets and uid ranges, each and together",
    )
    args = ap.parse_args()
    suffix = "_disk" if args.disk else "_isolation" if args.isolation else ""
    out = args.out or f"bench/results/runtime{suffix}.json"

    data = Path(tempfile.mkdtemp(prefix="sandhold-bench-", dir="/var/tmp"))
    settings = Settings(data_dir=data)
    rt = Runtime(settings).open()
    rt.templates.get("base")
    result: dict[str, object] = {
        "host": {"kernel": platform.release(), "cpus": __import__("os").cpu_count()},
        "n": args.n,
    }
    try:
        if args.disk:
            result["disk_budget"] = await disk_comparison(rt, args.n)
            write_result(out, result)
            return result
        if args.isolation:
            result["isolation"] = await comparison(rt, args.n, {
                "no_uid_ranges": {"uid_isolation": False},
                "no_disk_budget": {"disk_enforced": False},
                "neither": {"uid_isolation": False, "disk_enforced": False},
            })  # fmt: skip
            write_result(out, result)
            return result
        # Floors, interleaved with the real thing below in the same run.
        result["floor_python3_pass_ms"] = summary(
            timed_cmd(["/usr/bin/python3", "-c", "pass"], args.n)
        )
        result["floor_bwrap_true_ms"] = summary(timed_cmd(
            ["bwrap", "--unshare-all", "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib64",
             "/lib64", "--symlink", "usr/lib", "/lib", "/usr/bin/true"], args.n))  # fmt: skip

        rt.create({})  # warm caches (agent lib copy, template)
        creates, firsts, runs, runs_bash, pauses, resumes, kills = [], [], [], [], [], [], []
        for _ in range(args.n):
            t = time.perf_counter()
            info = rt.create({})
            creates.append((time.perf_counter() - t) * 1000)
            async with AgentClient(info.agent_socket) as c:
                # The agent reports ready once it accepts connections, before it has imported
                # everything: the first command also waits for that.
                await c.run(["/bin/true"])
                firsts.append((time.perf_counter() - t) * 1000)
                for _ in range(5):
                    t = time.perf_counter()
                    await c.run(["/bin/true"])
                    runs.append((time.perf_counter() - t) * 1000)
                    t = time.perf_counter()
                    await c.sh("true")
                    runs_bash.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            rt.pause(info.id)
            pauses.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            rt.resume(info.id)
            resumes.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            rt.kill(info.id)
            kills.append((time.perf_counter() - t) * 1000)
        for info in rt.list():
            rt.kill(info.id)
        result["create_to_ready_ms"] = summary(creates)
        result["create_to_first_command_ms"] = summary(firsts)
        result["command_roundtrip_true_ms"] = summary(runs)
        result["command_roundtrip_bash_login_ms"] = summary(runs_bash)
        result["pause_ms"] = summary(pauses)
        result["resume_ms"] = summary(resumes)
        result["kill_ms"] = summary(kills)

        # Idle density: create as many as asked, all at once alive, then measure PSS.
        ids = []
        t = time.perf_counter()
        failed = None
        for i in range(args.idle):
            try:
                ids.append((rt.create({"limits": {"memory_mb": 64}})).id)
            except Exception as e:  # report where the host stops, not a traceback
                failed = f"after {i}: {e}"
                break
        elapsed = time.perf_counter() - t
        await asyncio.sleep(2)
        per = [pss_kib(cgroups.group(s, settings.cgroup_group).pids()) / 1024 for s in ids[:50]]
        alive = 0
        for s in ids:
            async with AgentClient(rt.get(s).agent_socket, timeout=30) as c:
                alive += await c.health()
        mem_total = sum(
            cgroups.group(s, settings.cgroup_group).usage()["memory_bytes"] for s in ids
        )
        result["idle"] = {
            "requested": args.idle,
            "created": len(ids),
            "healthy": alive,
            "create_all_s": round(elapsed, 1),
            "pss_per_sandbox_mib": summary(per) if per else None,
            "cgroup_memory_per_sandbox_mib": round(mem_total / max(1, len(ids)) / 2**20, 2),
            "failure": failed,
        }
        t = time.perf_counter()
        for s in ids:
            rt.kill(s)
        result["idle"]["kill_all_s"] = round(time.perf_counter() - t, 1)  # type: ignore[index]
    finally:
        for info in rt.list():
            rt.kill(info.id)
        cgroups.remove_parent(settings.cgroup_group)
        shutil.rmtree(data, ignore_errors=True)
    write_result(out, result)
    return result


if __name__ == "__main__":
    asyncio.run(main())
