"""The overhead of metrics and logging on a warm tool call, on and off in the same run.

    .venv/bin/python bench/observability_bench.py [--rounds 20] [--calls 50] [--out FILE]

Two real `sandhold gateway serve` processes on this host (``local`` provider, SQLite store),
identical but for observability:

- ``on``: ``gateway_metrics=true`` (every tool call, store transaction, SQL statement and
  timeline event counted; gateway/prom.py), logs at INFO to the rotated JSON-lines file and to
  stderr as text (the defaults), and ``/metrics`` scraped every second during the run, as a
  Prometheus would;
- ``off``: ``gateway_metrics=false`` (the plain parts: nothing counted), ``log_level=ERROR``
  and ``log_stderr_format=off``.

Each has one warm session (its sandbox running, keep-alive long enough not to pause). The
rounds alternate which gateway goes first; each round makes ``--calls`` warm
``run_command("true")`` calls through the REST API on each. Reported: p50/p95/mean of each
arm (milliseconds, client side), and the differences. Prints one JSON document and writes it to
--out (bench/results/observability.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from benchstats import summary, write_result

KEY = "bench-tenant-key-0123456789"
ADMIN = "bench-admin-key-0123456789"
ARMS = {
    "on": {"SANDHOLD_GATEWAY_METRICS": "true", "SANDHOLD_LOG_LEVEL": "INFO",
           "SANDHOLD_LOG_STDERR_FORMAT": "text"},
    "off": {"SANDHOLD_GATEWAY_METRICS": "false", "SANDHOLD_LOG_LEVEL": "ERROR",
            "SANDHOLD_LOG_STDERR_FORMAT": "off"},
}  # fmt: skip


class Served:
    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        self.data_dir = root / name
        self.data_dir.mkdir(mode=0o755)
        policy = {"keep_alive_s": 3600, "retention_s": 3600}
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_")}
        env.update(ARMS[name], NO_PROXY="127.0.0.1", SANDHOLD_DATA_DIR=str(self.data_dir),
                   SANDHOLD_GATEWAY_ADMIN_KEY=ADMIN, SANDHOLD_PREBUILD_TEMPLATES="[]",
                   SANDHOLD_GATEWAY_TENANTS=json.dumps({"bench": {"api_key": KEY,
                                                                  "policy": policy}}),
                   SANDHOLD_GATEWAY_RECLAIM_INTERVAL_S="60")  # fmt: skip
        self.log = open(self.data_dir / "stderr.log", "wb")  # noqa: SIM115 - closed in stop
        with socket.socket() as s:  # bound here, served by the child on the inherited socket
            s.bind(("127.0.0.1", 0))
            s.listen(128)
            self.url = f"http://127.0.0.1:{s.getsockname()[1]}"
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sandhold.cli", "gateway", "serve", "--fd",
                 str(s.fileno())], env=env, stdout=self.log, stderr=subprocess.STDOUT,
                pass_fds=(s.fileno(),),
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{self.url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.05)
        self.client = httpx.Client(base_url=self.url, timeout=60,
                                   headers={"Authorization": f"Bearer {KEY}"})  # fmt: skip

    def call(self) -> float:
        t = time.perf_counter()
        r = self.client.post("/v1/sessions/warm/tools/run_command", json={"command": "true"})
        ms = (time.perf_counter() - t) * 1000
        assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text
        return ms

    def stop(self) -> None:
        self.client.delete("/v1/sessions/warm")
        self.client.close()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
        self.log.close()


def scrape(url: str, stop: threading.Event, seen: list[float]) -> None:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        while not stop.wait(1.0):
            t = time.perf_counter()
            r = c.get("/metrics")
            assert r.status_code == 200, r.text
            seen.append((time.perf_counter() - t) * 1000)


def run(rounds: int, calls: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="sandhold-obs-", dir="/var/tmp"))
    root.chmod(0o755)
    served = {name: Served(name, root) for name in ARMS}
    stop, scrapes = threading.Event(), []
    scraper = threading.Thread(target=scrape, args=(served["on"].url, stop, scrapes))
    try:
        for s in served.values():  # create the sandbox, then warm up
            for _ in range(10):
                s.call()
        scraper.start()
        times: dict[str, list[float]] = {name: [] for name in ARMS}
        for i in range(rounds):
            order = ["on", "off"] if i % 2 == 0 else ["off", "on"]
            for name in order:
                times[name] += [served[name].call() for _ in range(calls)]
        stop.set()
        scraper.join()
        logged = served["on"].data_dir / "logs" / "gateway.jsonl"
        lines = logged.read_bytes().count(b"\n") if logged.exists() else 0
        on, off = summary(times["on"]), summary(times["off"])
        return {
            "what": "warm run_command('true') through the REST API, metrics+logs on vs off",
            "host": platform.node(), "cpus": os.cpu_count(), "rounds": rounds,
            "calls_per_round": calls,
            "on_ms": on, "off_ms": off,
            "overhead_ms": {k: round(on[k] - off[k], 2) for k in ("p50", "p95", "mean")},
            "overhead_pct_p50": round(100 * (on["p50"] - off["p50"]) / off["p50"], 1),
            "scrapes": len(scrapes), "scrape_ms": summary(scrapes) if scrapes else None,
            "log_lines_on": lines,
        }  # fmt: skip
    finally:
        stop.set()
        for s in served.values():
            s.stop()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--out", default="bench/results/observability.json")
    a = ap.parse_args()
    write_result(a.out, run(a.rounds, a.calls))


if __name__ == "__main__":
    main()
