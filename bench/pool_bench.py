"""Sandboxes booted ahead (``pool_sizes``) against booting per create, in one run, through the
official e2b SDK: two `sandhold serve` processes on this host, one without a pool and one with a
pool of ``--pool`` ``base`` sandboxes, measured alternately.

    .venv/bin/python bench/pool_bench.py [--n 30] [--pool 40] [--concurrency 10]

Measures (milliseconds): create → first `commands.run("true")` result, create alone, and a burst
of ``--pool`` creates from ``--concurrency`` async clients (creates per second and latency):
on each server, the pool refilled before every sample. Writes bench/results/pool.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import tempfile
import time
from pathlib import Path

import httpx
from e2b import AsyncSandbox, Sandbox

from benchstats import destroy_data_dir, summary, write_result
from e2b_bench import API_KEY, start_server


def ready(url: str) -> int:
    text = httpx.get(f"{url}/metrics", headers={"X-API-KEY": API_KEY}).text
    m = re.search(r'sandhold_pool_ready\{template="base"\} (\d+)', text)
    return int(m.group(1)) if m else 0


def wait_full(url: str, size: int) -> None:
    deadline = time.monotonic() + 600
    while ready(url) < size:
        if time.monotonic() > deadline:
            raise RuntimeError("the pool did not fill")
        time.sleep(0.1)
    time.sleep(0.5)  # the last boot's background work settles


def first_result(url: str) -> tuple[float, float]:
    """(create, create → first command result), in ms."""
    t = time.perf_counter()
    s = Sandbox.create(timeout=120, api_url=url, sandbox_url=url)
    made = time.perf_counter()
    s.commands.run("true")
    done = time.perf_counter()
    s.kill()
    return (made - t) * 1000, (done - t) * 1000


async def burst(url: str, total: int, concurrency: int) -> dict[str, object]:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(total):
        queue.put_nowait(i)
    made: list[AsyncSandbox] = []
    latencies: list[float] = []

    async def client() -> None:
        while not queue.empty():
            queue.get_nowait()
            t = time.perf_counter()
            made.append(await AsyncSandbox.create(timeout=120, api_url=url, sandbox_url=url))
            latencies.append((time.perf_counter() - t) * 1000)

    t = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t
    await asyncio.gather(*(s.kill() for s in made))
    return {"creates": total, "concurrency": concurrency, "elapsed_s": round(elapsed, 2),
            "creates_per_s": round(total / elapsed, 1),
            "create_latency_ms": summary(latencies)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--pool", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=10)
    ap.add_argument("--out", default="bench/results/pool.json")
    args = ap.parse_args()
    os.environ.update(E2B_API_KEY=API_KEY, NO_PROXY="127.0.0.1,localhost")
    dirs, procs, urls = [], [], {}
    for name, settings in (("boot", {}), ("pool", {"pool_sizes": f'{{"base": {args.pool}}}'})):
        d = Path(tempfile.mkdtemp(prefix=f"sandhold-pool-bench-{name}-", dir="/var/tmp"))
        d.chmod(0o755)
        dirs.append(d)
        proc, urls[name] = start_server(d, Path(tempfile.gettempdir()) / f"pool-bench-{name}.log",
                                        **settings)  # fmt: skip
        procs.append(proc)
    result: dict[str, object] = {"cpus": os.cpu_count(), "pool": args.pool, "n": args.n,
                                 "loadavg_1m_at_start": round(os.getloadavg()[0], 2)}  # fmt: skip
    try:
        for url in urls.values():
            Sandbox.create(timeout=60, api_url=url, sandbox_url=url).kill()  # warm-up
        wait_full(urls["pool"], args.pool)
        samples: dict[str, dict[str, list[float]]] = {k: {"create": [], "first": []} for k in urls}
        for _ in range(args.n):
            for name, url in urls.items():
                create, first = first_result(url)
                samples[name]["create"].append(create)
                samples[name]["first"].append(first)
            wait_full(urls["pool"], args.pool)
        for name in urls:
            result[f"{name}_create_ms"] = summary(samples[name]["create"])
            result[f"{name}_create_to_first_result_ms"] = summary(samples[name]["first"])
        for name, url in urls.items():
            result[f"{name}_burst"] = asyncio.run(burst(url, args.pool, args.concurrency))
            wait_full(urls["pool"], args.pool)
        p50 = lambda k: result[k]["p50"]  # type: ignore[index]  # noqa: E731
        result["ratio_first_result_boot_over_pool"] = round(
            p50("boot_create_to_first_result_ms") / p50("pool_create_to_first_result_ms"), 1
        )
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        for d in dirs:
            destroy_data_dir(d)
    write_result(args.out, result)


if __name__ == "__main__":
    main()
