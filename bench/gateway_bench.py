"""Session gateway benchmarks, on this host, with the ``local`` provider.

    .venv/bin/python bench/gateway_bench.py [--n 30] [--paused 1000] [--out FILE.json]

Measures, through a real `sandhold gateway serve` process over REST (milliseconds):
- ``tool_call_warm_ms``: a ``run_command("true")`` round trip on a session whose sandbox runs;
- ``first_call_ms``: the first call of a new session (create + run);
- ``resume_on_call_ms``: the first call after the sandbox auto-paused (resume + run);
and in-process, with the store on SQLite:
- ``reclaim_pass``: one reclaim pass over ``--paused`` paused sandboxes (all past retention),
  i.e. list, judge, lock, conditional kill and record each one.
Prints one JSON document and writes it to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchstats import summary, write_result
from sandhold.config import Settings
from sandhold.gateway.app import Gateway
from sandhold.runtime import cgroups
from sandhold.runtime.runtime import Runtime

KEY = "bench-tenant-key-0123456789"


def env_for(data_dir: Path, keep_alive: int, retention: int) -> dict[str, str]:
    policy = {"keep_alive_s": keep_alive, "retention_s": retention, "max_live_sandboxes": 5000}
    return {
        "SANDHOLD_DATA_DIR": str(data_dir),
        "SANDHOLD_GATEWAY_TENANTS": json.dumps({"bench": {"api_key": KEY, "policy": policy}}),
        "SANDHOLD_LIFECYCLE_INTERVAL_S": "0.2",
        "SANDHOLD_GATEWAY_RECLAIM_INTERVAL_S": "3600",
        "SANDHOLD_PREBUILD_TEMPLATES": "[]",
    }


def rest_latencies(data_dir: Path, n: int) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_")}
    env.update(env_for(data_dir, keep_alive=1, retention=3600), NO_PROXY="127.0.0.1")
    log = open(data_dir / "gateway.log", "wb")  # noqa: SIM115 - closed below
    # Bound and listening here, served by the child on the inherited socket (--fd): the port is
    # never free between choosing it and serving on it.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(2048)
        port = s.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-m", "sandhold.cli", "gateway", "serve", "--fd",
                                 str(s.fileno())], env=env, stdout=log, stderr=subprocess.STDOUT,
                                pass_fds=(s.fileno(),))  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.05)
        c = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)

        def call(session: str) -> float:
            t = time.perf_counter()
            r = c.post(f"/v1/sessions/{session}/tools/run_command", json={"command": "true"})
            assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text
            return (time.perf_counter() - t) * 1000

        first = [call(f"first-{i}") for i in range(n)]
        call("warm")
        warm = [call("warm") for _ in range(n)]
        resume = []
        for i in range(min(n, 10)):
            sid = f"first-{i}"
            while c.get(f"/v1/sessions/{sid}").json()["sandbox"]["state"] != "paused":
                time.sleep(0.1)
            resume.append(call(sid))
        for i in range(n):
            c.delete(f"/v1/sessions/first-{i}")
        c.delete("/v1/sessions/warm")
        return {"tool_call_warm_ms": summary(warm), "first_call_ms": summary(first),
                "resume_on_call_ms": summary(resume)}  # fmt: skip
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        log.close()


async def reclaim_pass(data_dir: Path, paused: int) -> dict[str, object]:
    os.environ.update(env_for(data_dir, keep_alive=1, retention=0))
    gw = Gateway(Settings())
    async with gw.running(reclaim=False):
        # retention 0 would let the reclaimer race the creates; it is not running yet
        t0 = time.perf_counter()
        sem = asyncio.Semaphore(8)

        async def one(i: int) -> None:
            async with sem, gw.manager.use("bench", f"p{i}", "bench", 10):
                pass

        await asyncio.gather(*(one(i) for i in range(paused)))
        created_s = time.perf_counter() - t0
        while True:  # the provider pauses each one a second after its call
            states = [s.state for s in await gw.provider.list(gw.manager.gateway_tags())]
            if states.count("paused") == paused:
                break
            await asyncio.sleep(0.5)
        report = await gw.reclaimer.run_pass()
        left = len(await gw.provider.list(gw.manager.gateway_tags()))
    return {"sandboxes": paused, "create_all_s": round(created_s, 1),
            "pass_s": report.seconds, "reclaimed": report.reclaimed,
            "per_sandbox_ms": round(report.seconds * 1000 / max(report.reclaimed, 1), 2),
            "left_after_pass": left}  # fmt: skip


def cleanup(data_dir: Path) -> None:
    settings = Settings(data_dir=data_dir)
    rt = Runtime(settings).open()
    for info in rt.list():
        rt.kill(info.id)
    cgroups.remove_parent(settings.cgroup_group)
    shutil.rmtree(data_dir, ignore_errors=True)


def main() -> dict[str, object]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=30, help="samples per latency measurement")
    ap.add_argument("--paused", type=int, default=1000, help="paused sandboxes to reclaim")
    ap.add_argument("--out", default="bench/results/gateway.json")
    args = ap.parse_args()
    result: dict[str, object] = {
        "host": {"kernel": platform.release(), "cpus": os.cpu_count(),
                 "loadavg_1m_at_start": round(os.getloadavg()[0], 2)},
        "provider": "local", "store": "sqlite",
    }  # fmt: skip
    steps = [
        ("rest", lambda d: rest_latencies(d, args.n)),
        ("reclaim_pass", lambda d: asyncio.run(reclaim_pass(d, args.paused))),
    ]
    for name, fn in steps:
        d = Path(tempfile.mkdtemp(prefix="sandhold-gwbench-", dir="/var/tmp"))
        d.chmod(0o755)
        try:
            out = fn(d)
            result.update(out if name == "rest" else {name: out})
        finally:
            cleanup(d)
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
