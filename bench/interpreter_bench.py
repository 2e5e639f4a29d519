"""Code-interpreter benchmarks: template build, fresh sandbox to first ``run_code`` result, warm
``1+1`` round trip, and memory (PSS) of an idle interpreter sandbox.

    .venv/bin/python bench/interpreter_bench.py [--n 10] [--iterations 200] \\
        [--cache /var/tmp/sandhold-cache/interpreter] [--out bench/results/interpreter.json]

Prints one JSON document (and writes it to --out). Times are milliseconds.

Three ways a sandbox starts are timed, interleaved in one run: ``cold`` (booted: agent, service,
kernel start), ``warm`` (restored from the template's checkpoint, runtime/warm.py; made first,
its build time and size reported) and ``pool`` (booted ahead, runtime/pool.py, and taken by the
create). Without CRIU ``warm`` does not run.

It drives the runtime directly, the way the agent will once its ``services`` start the
interpreter at boot: create the sandbox, start the service with the template's own argv/env
(one agent exec, as the agent would), and time, from inside the sandbox, the first answer of
``POST /execute {"code": "1+1"}``. So "first result" = sandbox create + service start + kernel
start + one execution, without the host HTTP proxy (measured by bench/e2b_bench.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from benchstats import destroy_data_dir, pss_kib, summary, write_result
from sandhold.config import Settings
from sandhold.interpreter.template import (
    SERVICE_PORT,
    TEMPLATE_NAME,
    build_code_interpreter_template,
)
from sandhold.runtime.cgroups import CgroupSet
from sandhold.runtime.client import AgentClient
from sandhold.runtime.criu import criu_status
from sandhold.runtime.runtime import Runtime

# Runs inside the sandbox: wait for the service, then time executions over one keep-alive
# connection. Prints JSON: the wall-clock time of the first result and the round trips.
CLIENT = r"""
import http.client, json, sys, time
port, iterations = int(sys.argv[1]), int(sys.argv[2])
body = json.dumps({"code": "1+1", "context_id": None, "language": None, "env_vars": None})

def execute(conn):
    conn.request("POST", "/execute", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    text = r.read().decode()
    assert r.status == 200 and '"text": "2"' in text, text
    return text

while True:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        execute(conn)
        break
    except (ConnectionRefusedError, OSError):
        time.sleep(0.01)
first = time.time()
rtts = []
for _ in range(iterations):
    t = time.perf_counter()
    execute(conn)
    rtts.append((time.perf_counter() - t) * 1000)
print(json.dumps({"first_result_at": first, "rtt_ms": rtts}))
"""


async def one_sandbox(rt: Runtime, iterations: int, mode: str) -> dict[str, object]:
    t0 = time.time()
    info = rt.create({"template": TEMPLATE_NAME, "limits": {"memory_mb": 1024}})
    created = time.time()
    if info.started_from != (mode if mode in ("warm", "pool") else None):
        raise RuntimeError(f"a {mode} round started {info.started_from or 'cold'}")
    try:
        async with AgentClient(info.agent_socket, timeout=300) as agent:
            r = await agent.run(
                ["/usr/bin/python3", "-c", CLIENT, str(SERVICE_PORT), str(iterations)],
                user="user",
            )
            if r.exit_code != 0:
                raise RuntimeError(f"client failed: {r.stderr.decode()[-2000:]}")
            out = json.loads(r.stdout)
            await asyncio.sleep(2.0)  # let the interpreter go idle before measuring memory
            pids = CgroupSet(info.id, rt.settings.cgroup_group).pids()
            return {
                "create_ms": (created - t0) * 1000,
                "first_result_ms": (out["first_result_at"] - t0) * 1000,
                "rtt_ms": out["rtt_ms"],
                "pss_kib": pss_kib(pids),
                "processes": len(pids),
                "cgroup_memory_bytes": rt.usage(info.id).memory_bytes,
            }
    finally:
        rt.kill(info.id)


async def main(args: argparse.Namespace) -> dict[str, object]:
    data_dir = Path(tempfile.mkdtemp(prefix="sandhold-ibench-", dir="/var/tmp"))
    data_dir.chmod(0o755)
    settings = Settings(data_dir=data_dir)
    try:
        rt = Runtime(settings).open()
        t = time.perf_counter()
        build_code_interpreter_template(rt.templates, cache_dir=Path(args.cache))
        build_ms = (time.perf_counter() - t) * 1000
        modes = {"cold": Runtime(settings.model_copy(update={"warm_templates": False})).open()}
        warm: dict[str, object] = {"available": False}
        if criu_status(settings.criu_path)[0]:
            t = time.perf_counter()
            checkpoint = rt.warm.build(TEMPLATE_NAME)
            warm = {"available": True, "build_ms": round((time.perf_counter() - t) * 1000, 1),
                    "size_mib": round(du(checkpoint) / 2**20, 1)}  # fmt: skip
            modes["warm"] = rt
        # Booted ahead (runtime/pool.py), itself started warm where it can: refilled, untimed,
        # before each of its rounds.
        modes["pool"] = Runtime(settings.model_copy(update={"pool_sizes": {TEMPLATE_NAME: 1}}))
        modes["pool"].open()
        runs: dict[str, list[dict[str, object]]] = {m: [] for m in modes}
        for i in range(args.n):  # interleaved: the host's load falls on both alike
            for mode, r in modes.items():
                if mode == "pool":
                    r.pools.fill(TEMPLATE_NAME)
                    await asyncio.sleep(1.0)  # the boot's own work settles first
                runs[mode].append(await one_sandbox(r, args.iterations if i == 0 else 0, mode))
        out: dict[str, object] = {
            "host": {"cpus": os.cpu_count(), "kernel": platform.release()},
            "template_build_ms": round(build_ms, 1),
            "template_build_note": "with the wheel/site cache in --cache already filled",
            "warm_checkpoint": warm,
        }
        for mode, rs in runs.items():
            out[mode] = {
                "sandbox_create_ms": summary([r["create_ms"] for r in rs]),  # type: ignore[misc]
                "fresh_sandbox_to_first_result_ms": summary(
                    [r["first_result_ms"] for r in rs]  # type: ignore[misc]
                ),
                "warm_run_code_1plus1_rtt_ms": summary(rs[0]["rtt_ms"]),  # type: ignore[arg-type]
                "idle_sandbox_pss_mib": summary([r["pss_kib"] / 1024 for r in rs]),  # type: ignore[operator]
                "idle_sandbox_processes": rs[0]["processes"],
                "idle_sandbox_cgroup_memory_mib": summary(
                    [r["cgroup_memory_bytes"] / 2**20 for r in rs]  # type: ignore[operator]
                ),
            }
        return out
    finally:
        destroy_data_dir(data_dir)


def du(path: Path) -> int:
    """Bytes on disk under ``path`` (hard links once)."""
    seen, total = set(), 0
    for f in path.rglob("*"):
        st = f.lstat()
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10, help="fresh sandboxes to time")
    parser.add_argument("--iterations", type=int, default=200, help="warm 1+1 round trips")
    parser.add_argument("--cache", default="/var/tmp/sandhold-cache/interpreter")
    parser.add_argument("--out", default="bench/results/interpreter.json")
    args = parser.parse_args()
    result = asyncio.run(main(args))
    write_result(args.out, result)
