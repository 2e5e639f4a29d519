"""Runtime benchmarks on this host: create-to-ready, create-to-first-command, command round
trip, pause/resume, memory per idle sandbox and how many idle sandboxes fit, with the floors
measured in the same run.

    .venv/bin/python bench/runtime_bench.py [--n 30] [--idle 500] [--out bench/results/runtime.json]

Prints one JSON document (and writes it to --out). Times are milliseconds.
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

from benchstats import pss_kib, summary, write_result
from sandhold.config import Settings
from sandhold.runtime import cgroups
from sandhold.runtime.cgroups import CgroupSet
from sandhold.runtime.client import AgentClient
from sandhold.runtime.runtime import Runtime


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
    ap.add_argument("--out", default="bench/results/runtime.json")
    args = ap.parse_args()

    data = Path(tempfile.mkdtemp(prefix="sandhold-bench-", dir="/var/tmp"))
    settings = Settings(data_dir=data)
    rt = Runtime(settings).open()
    rt.templates.get("base")
    result: dict[str, object] = {
        "host": {"kernel": platform.release(), "cpus": __import__("os").cpu_count()},
        "n": args.n,
    }
    try:
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
        per = [pss_kib(CgroupSet(s, settings.cgroup_group).pids()) / 1024 for s in ids[:50]]
        alive = 0
        for s in ids:
            async with AgentClient(rt.get(s).agent_socket, timeout=30) as c:
                alive += await c.health()
        mem_total = sum(CgroupSet(s, settings.cgroup_group).usage()["memory_bytes"] for s in ids)
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
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    asyncio.run(main())
