"""``GET /metrics`` of ``sandhold serve`` (service/prom.py): its scrape time with 0, 100 and
1,000 live sandboxes, and the overhead of metrics on a create, in one run: two servers on this
host, one with metrics on (and scraped every second, as a Prometheus would) and one with
``server_metrics=false``, measured alternately.

    nice -n 10 .venv/bin/python bench/metrics_bench.py [--n 30] [--live 0,100,1000]

Scrape: ``--scrapes`` GETs of /metrics at each live count (ms), and, on the same records, the
collector's sandbox pass (the records read as stored) against the runtime's own listing
(``Runtime.list``: validated records and a liveness check each) that it avoids. Live sandboxes
are ``base`` ones made through the REST API, 4 at a time (30 s ready timeout, 3 tries each);
creating stops early when the host's available memory falls below 3 GiB (the figure says how
many were live). Writes bench/results/metrics.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import tempfile
import threading
import time
from pathlib import Path

import httpx
from e2b import Sandbox

from benchstats import destroy_data_dir, summary, write_result
from e2b_bench import API_KEY, start_server
from sandhold.config import Settings
from sandhold.runtime.runtime import Runtime
from sandhold.service.prom import records

HEADERS = {"X-API-KEY": API_KEY}
MIN_AVAILABLE = 3 << 30


def available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def create_ms(url: str) -> float:
    t = time.perf_counter()
    s = Sandbox.create(timeout=120, api_url=url, sandbox_url=url)
    ms = (time.perf_counter() - t) * 1000
    s.kill()
    return ms


def scrape_ms(url: str, n: int) -> tuple[dict[str, float], int]:
    times, size = [], 0
    with httpx.Client(base_url=url, headers=HEADERS, timeout=60) as c:
        for _ in range(n):
            t = time.perf_counter()
            r = c.get("/metrics")
            times.append((time.perf_counter() - t) * 1000)
            r.raise_for_status()
            size = len(r.content)
    return summary(times), size


def passes_ms(data_dir: Path, n: int) -> dict[str, object]:
    rt = Runtime(Settings(data_dir=data_dir))  # read only: list() needs no open()
    fast, full = [], []
    for _ in range(n):
        t = time.perf_counter()
        count = sum(1 for _ in records(rt.sandboxes_dir))
        fast.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        rt.list()
        full.append((time.perf_counter() - t) * 1000)
    return {"records": count, "collector_records_ms": summary(fast),
            "runtime_list_ms": summary(full)}  # fmt: skip


async def fill(url: str, target: int, have: int) -> int:
    """Live sandboxes up to ``target`` (``have`` already), 4 creates at once; returns the count."""
    body = {"templateID": "base", "timeout": 3600}
    stop = asyncio.Event()

    async def worker(c: httpx.AsyncClient) -> None:
        nonlocal have
        while have < target and not stop.is_set():
            if available() < MIN_AVAILABLE:
                stop.set()
                return
            have += 1
            for attempt in range(3):  # a loaded host's agent may miss the ready timeout
                r = await c.post("/sandboxes", json=body)
                if r.status_code == 201:
                    break
                print(f"create failed ({r.status_code}): {r.text[:200]} (attempt {attempt + 1})")
            else:
                have -= 1
                stop.set()

    async with httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=300) as c:
        await asyncio.gather(*(worker(c) for _ in range(4)))
    return have


def scraper(url: str, stop: threading.Event) -> None:
    with httpx.Client(base_url=url, headers=HEADERS, timeout=60) as c:
        while not stop.wait(1.0):
            c.get("/metrics")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=30, help="creates on each server")
    ap.add_argument("--live", default="0,100,1000")
    ap.add_argument("--scrapes", type=int, default=20)
    ap.add_argument("--out", default="bench/results/metrics.json")
    args = ap.parse_args()
    os.environ.update(E2B_API_KEY=API_KEY, NO_PROXY="127.0.0.1,localhost")
    dirs, procs, urls = [], [], {}
    for name, settings in (("on", {}), ("off", {"server_metrics": "false"})):
        settings["ready_timeout_s"] = "30"  # a loaded host's creates, not the metrics, at issue
        d = Path(tempfile.mkdtemp(prefix=f"sandhold-metrics-bench-{name}-", dir="/var/tmp"))
        d.chmod(0o755)
        dirs.append(d)
        proc, urls[name] = start_server(
            d, Path(tempfile.gettempdir()) / f"metrics-bench-{name}.log", **settings
        )
        procs.append(proc)
    result: dict[str, object] = {
        "host": {"kernel": platform.release(), "cpus": os.cpu_count(),
                 "mem_total_mib": os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 20,
                 "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]},
        "n": args.n,
    }  # fmt: skip
    stop = threading.Event()
    try:
        for url in urls.values():
            create_ms(url)  # warm-up
        # Overhead on a create: the "on" server observes its histograms and is scraped at 1 Hz.
        t = threading.Thread(target=scraper, args=(urls["on"], stop), daemon=True)
        t.start()
        samples: dict[str, list[float]] = {k: [] for k in urls}
        for _ in range(args.n):
            for name, url in urls.items():
                samples[name].append(create_ms(url))
        stop.set()
        t.join()
        for name in urls:
            result[f"create_metrics_{name}_ms"] = summary(samples[name])
        on, off = (result[f"create_metrics_{k}_ms"]["p50"] for k in ("on", "off"))  # type: ignore[index]
        result["create_overhead_p50_ms"] = round(on - off, 2)
        # Scrape time by live sandboxes.
        live, scrapes = 0, []
        for target in (int(x) for x in args.live.split(",")):
            t0 = time.perf_counter()
            live = asyncio.run(fill(urls["on"], target, live))
            made_s = round(time.perf_counter() - t0, 1)
            time.sleep(2)  # the last creates' background work settles
            ms, size = scrape_ms(urls["on"], args.scrapes)
            row = {"target": target, "live": live, "fill_s": made_s, "scrape_ms": ms,
                   "bytes": size, **passes_ms(dirs[0], 5)}  # fmt: skip
            print(row)
            scrapes.append(row)
            if live < target:
                break
        result["scrape"] = scrapes
    finally:
        stop.set()
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
        for d in dirs:
            destroy_data_dir(d)
    write_result(args.out, result)


if __name__ == "__main__":
    main()
