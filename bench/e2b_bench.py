"""E2B-compatible server benchmarks, measured through the official, unmodified e2b SDK against a
real `sandhold serve` process on this host (started here on a throw-away data dir).

    .venv/bin/python bench/e2b_bench.py [--n 30] [--concurrency 10] [--out bench/results/e2b.json]
    .venv/bin/python bench/e2b_bench.py --before-src DIR [--n 300]   (DIR: another tree's src/)

Measures: `Sandbox.create()` to ready, `commands.run("true")` round trip (and, as its floor, the
same command straight over the agent's socket), a fresh session (create -> run -> kill), creates
per second with N concurrent async clients, and pause/resume round trips. Prints one JSON
document (and writes it to --out). Times are milliseconds.

With ``--before-src``, only ``commands.run("true")`` and create → first result, on a server run
from that tree and on one from this tree, sample by sample alternately in one run (the host's
noise then falls on both sides alike), with their ratios; written to bench/results/e2b-ab.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from e2b import AsyncSandbox, Sandbox
from e2b.api.metadata import package_version

from benchstats import destroy_data_dir, summary, write_result
from sandhold.config import Settings
from sandhold.runtime.client import AgentClient
from sandhold.runtime.runtime import Runtime

API_KEY = "bench-key"


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


def start_server(
    data_dir: Path, log: Path, src: Path | None = None, **settings: str
) -> tuple[subprocess.Popen[bytes], str]:
    """A `sandhold serve` on ``data_dir`` (from the tree ``src`` if given, else this one)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_")}
    if src is not None:
        env["PYTHONPATH"] = str(src)  # (ahead of the venv's editable install of this tree)
    env.update(
        SANDHOLD_DATA_DIR=str(data_dir),
        SANDHOLD_API_KEYS=json.dumps({API_KEY: "bench"}),
        SANDHOLD_PREBUILD_TEMPLATES="[]",
    )  # a background build would skew every figure
    env.update({f"SANDHOLD_{k.upper()}": v for k, v in settings.items()})
    # Bound and listening here, served by the child on the inherited socket (--fd): the port is
    # never free between choosing it and serving on it.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(2048)
        port = s.getsockname()[1]
        proc = subprocess.Popen(
            [sys.executable, "-m", "sandhold.cli", "serve", "--fd", str(s.fileno())],
            env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, pass_fds=(s.fileno(),),
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"server did not start: {log.read_text()[-2000:]}")


async def concurrent_creates(total: int, concurrency: int) -> dict[str, object]:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(total):
        queue.put_nowait(i)
    created: list[AsyncSandbox] = []
    latencies: list[float] = []

    async def client() -> None:
        while not queue.empty():
            queue.get_nowait()
            t = time.perf_counter()
            created.append(await AsyncSandbox.create(timeout=300))
            latencies.append((time.perf_counter() - t) * 1000)

    t = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t
    await asyncio.gather(*(s.kill() for s in created))
    return {"concurrency": concurrency, "creates": total, "elapsed_s": round(elapsed, 2),
            "creates_per_s": round(total / elapsed, 2),
            "create_latency_ms": summary(latencies)}  # fmt: skip


async def direct_agent_floor(data_dir: Path, sandbox_id: str, n: int) -> list[float]:
    info = Runtime(Settings(data_dir=data_dir)).get(sandbox_id)
    out = []
    async with AgentClient(info.agent_socket) as c:
        await c.sh("true")
        for _ in range(n):
            t = time.perf_counter()
            await c.sh("true")
            out.append((time.perf_counter() - t) * 1000)
    return out


def compare(before_src: Path, n: int) -> dict[str, object]:
    sides = {"before": before_src.resolve(), "after": Path(__file__).resolve().parents[1] / "src"}
    servers: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    runs: dict[str, list[float]] = {side: [] for side in sides}
    firsts: dict[str, list[float]] = {side: [] for side in sides}
    try:
        sandboxes, sdks = {}, {}
        for side, src in sides.items():
            data = Path(tempfile.mkdtemp(prefix=f"sandhold-e2b-ab-{side}-", dir="/var/tmp"))
            data.chmod(0o755)
            log = Path(tempfile.gettempdir()) / f"sandhold-e2b-ab-{side}.log"
            proc, url = start_server(data, log, src)
            servers[side] = (proc, data)
            sdks[side] = {"api_url": url, "sandbox_url": url, "api_key": API_KEY}
            sandboxes[side] = Sandbox.create(timeout=3600, **sdks[side])
            sandboxes[side].commands.run("true")
        for i in range(n):
            for side, sbx in sandboxes.items():
                runs[side].append(timed(lambda sbx=sbx: sbx.commands.run("true")))
                if i % 10 == 0:
                    t = time.perf_counter()
                    fresh = Sandbox.create(timeout=60, **sdks[side])
                    fresh.commands.run("true")
                    firsts[side].append((time.perf_counter() - t) * 1000)
                    fresh.kill()
    finally:
        for proc, data in servers.values():
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
            destroy_data_dir(data)
    out: dict[str, object] = {"sides": {k: str(v) for k, v in sides.items()}, "n": n}
    for name, samples in (("command_run_true_ms", runs), ("create_to_first_result_ms", firsts)):
        both = {side: summary(v) for side, v in samples.items()}
        ratio = both["after"]["p50"] / both["before"]["p50"]
        out[name] = {**both, "after_over_before_p50": round(ratio, 3)}
    return out


def main() -> dict[str, object]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=30, help="samples per latency measurement")
    ap.add_argument("--concurrency", type=int, default=10, help="clients creating at once")
    ap.add_argument("--creates", type=int, default=0, help="total concurrent creates [3*conc]")
    ap.add_argument("--out", default="bench/results/e2b.json")
    ap.add_argument("--before-src", type=Path, help="compare with this src/ (see above)")
    args = ap.parse_args()
    if args.before_src is not None:
        ab = compare(args.before_src, args.n)
        write_result(args.out.replace("e2b.json", "e2b-ab.json"), ab)
        return ab

    data = Path(tempfile.mkdtemp(prefix="sandhold-e2b-bench-", dir="/var/tmp"))
    data.chmod(0o755)
    proc, url = start_server(data, Path(tempfile.gettempdir()) / "sandhold-e2b-bench.log")
    os.environ.update(E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=API_KEY,
                      NO_PROXY="127.0.0.1,localhost")  # fmt: skip
    os.environ.pop("E2B_DEBUG", None)
    result: dict[str, object] = {
        "host": {
            "kernel": platform.release(),
            "cpus": os.cpu_count(),
            "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
        },
        "sdk": f"e2b {package_version}",
        "n": args.n,
    }
    try:
        Sandbox.create(timeout=60).kill()  # warm-up: template, agent library copy, pools
        creates, kills = [], []
        for _ in range(args.n):
            t = time.perf_counter()
            s = Sandbox.create(timeout=300)
            creates.append((time.perf_counter() - t) * 1000)
            kills.append(timed(s.kill))
        result["create_to_ready_ms"] = summary(creates)
        result["kill_ms"] = summary(kills)

        s = Sandbox.create(timeout=600)
        s.commands.run("true")
        result["command_run_true_ms"] = summary(
            [timed(lambda: s.commands.run("true")) for _ in range(args.n)]
        )
        result["command_run_true_direct_agent_ms"] = summary(
            asyncio.run(direct_agent_floor(data, s.sandbox_id, args.n))
        )

        def write_read() -> None:
            s.files.write("/tmp/b", b"x" * 1024)
            s.files.read("/tmp/b")

        result["files_write_read_1kib_ms"] = summary([timed(write_read) for _ in range(args.n)])
        pauses, resumes, roundtrips = [], [], []
        for _ in range(args.n):
            t = time.perf_counter()
            pauses.append(timed(s.pause))
            resumes.append(timed(lambda: Sandbox.connect(s.sandbox_id, timeout=600)))
            s.commands.run("true")
            roundtrips.append((time.perf_counter() - t) * 1000)
        result["pause_ms"] = summary(pauses)
        result["resume_via_connect_ms"] = summary(resumes)
        result["pause_resume_run_roundtrip_ms"] = summary(roundtrips)
        s.kill()

        def session() -> None:
            sb = Sandbox.create(timeout=60)
            sb.commands.run("true")
            sb.kill()

        result["session_create_run_kill_ms"] = summary([timed(session) for _ in range(args.n)])
        result["concurrent_creates"] = asyncio.run(
            concurrent_creates(args.creates or 3 * args.concurrency, args.concurrency)
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        destroy_data_dir(data)
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
