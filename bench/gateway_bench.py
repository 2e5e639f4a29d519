"""Session gateway benchmarks, on this host, with the ``local`` provider.

    .venv/bin/python bench/gateway_bench.py [--n 30] [--warm N] [--stores sqlite,postgresql]
        [--paused 1000] [--scale 10000 --sample 20] [--only rest,reclaim,scale] [--out FILE]
        [--before-src DIR --rounds 3]

Measures, through a real `sandhold gateway serve` process over REST (milliseconds), once per
store of ``--stores`` (PostgreSQL: a throw-away server on a unix socket, tests/gateway/postgres.py):
- ``tool_call_warm_ms``: a ``run_command("true")`` round trip on a session whose sandbox runs
  (the default keep-alive, 15 min), calls back to back;
- ``tool_call_warm_spaced_ms``: the same, 50 ms between calls (as an agent loop's come: the
  end of a call, restoring the keep-alive, is then done before the next one);
- ``tool_call_warm_short_keep_alive_ms``: back to back with a 1 s keep-alive (shorter than a
  call's budget, so that every call extends the sandbox's end at the provider first);
- ``first_call_ms``: the first call of a new session (create + run);
- ``resume_on_call_ms``: the first call after the sandbox auto-paused (resume + run);
and in-process, with the store on SQLite:
- ``reclaim_pass``: one reclaim pass over ``--paused`` real paused sandboxes (all past
  retention): list, judge, lock, conditional kill and record each one;
- ``reclaim_pass_scaled``: one pass over ``--scale`` paused sessions of which ``--sample`` have
  real sandboxes (killed for real, in parallel); the provider lists the real ones (the local
  provider, i.e. the sandbox service) plus in-memory stand-ins for the rest, whose kills are a
  dict deletion (with the same conditional check). It measures the pass's own part (one list,
  the in-memory decisions, the batched store writes, the bounded parallel kills) at that scale
  over a real SQLite store; a real local kill's cost is in ``reclaim_pass``.
Prints one JSON document and writes it to --out.

With ``--before-src DIR`` (another tree's ``src/``, e.g. from ``git worktree add``), the same
steps run ``--rounds`` times on each side, interleaved (before, after, after, before, ...), each
run a process of its own with its side's ``src/`` on ``PYTHONPATH``: the JSON then has every
run of each side, the median over the rounds of each side's figures and their ratios
(after / before, < 1 is faster), so that the shared host's noise falls on both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchstats import destroy_data_dir, summary, write_result
from sandhold.config import Settings
from sandhold.gateway.app import Gateway
from sandhold.gateway.providers.base import PreconditionFailed, ProviderSandbox
from sandhold.store.models import Session

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.gateway.postgres import Postgres

KEY = "bench-tenant-key-0123456789"
# A tenant with the default keep-alive (15 min), for the warm calls: "bench" pauses its
# sandboxes a second after each call (the resume measure needs that).
WARM_KEY = "bench-warm-tenant-key-012345"
SPACED_S = 0.05  # between the spaced warm calls: an agent loop's model thinks in between


def env_for(data_dir: Path, keep_alive: int, retention: int) -> dict[str, str]:
    policy = {"keep_alive_s": keep_alive, "retention_s": retention, "max_live_sandboxes": 5000}
    warm = {"api_key": WARM_KEY, "policy": {"retention_s": retention}}
    tenants = {"bench": {"api_key": KEY, "policy": policy}, "bench-warm": warm}
    return {
        "SANDHOLD_DATA_DIR": str(data_dir),
        "SANDHOLD_GATEWAY_TENANTS": json.dumps(tenants),
        "SANDHOLD_LIFECYCLE_INTERVAL_S": "0.2",
        "SANDHOLD_GATEWAY_RECLAIM_INTERVAL_S": "3600",
        "SANDHOLD_PREBUILD_TEMPLATES": "[]",
    }


def rest_latencies(
    data_dir: Path, n: int, warm_n: int, store_url: str | None = None
) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_")}
    env.update(env_for(data_dir, keep_alive=1, retention=3600), NO_PROXY="127.0.0.1")
    if store_url is not None:
        env["SANDHOLD_GATEWAY_STORE_URL"] = store_url
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

        warm_c = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {WARM_KEY}"},
                              timeout=60)  # fmt: skip

        def call(session: str, client: httpx.Client = c) -> float:
            t = time.perf_counter()
            path = f"/v1/sessions/{session}/tools/run_command"
            r = client.post(path, json={"command": "true"})
            assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text
            return (time.perf_counter() - t) * 1000

        def spaced(session: str, client: httpx.Client) -> float:
            time.sleep(SPACED_S)
            return call(session, client)

        first = [call(f"first-{i}") for i in range(n)]
        call("warm", warm_c)
        warm = [call("warm", warm_c) for _ in range(warm_n)]
        warm_spaced = [spaced("warm", warm_c) for _ in range(warm_n)]
        call("warm-short")
        warm_short = [call("warm-short") for _ in range(warm_n)]
        resume = []
        for i in range(min(n, 10)):
            sid = f"first-{i}"
            while c.get(f"/v1/sessions/{sid}").json()["sandbox"]["state"] != "paused":
                time.sleep(0.1)
            resume.append(call(sid))
        for i in range(n):
            c.delete(f"/v1/sessions/first-{i}")
        warm_c.delete("/v1/sessions/warm")
        c.delete("/v1/sessions/warm-short")
        return {"tool_call_warm_ms": summary(warm),
                "tool_call_warm_spaced_ms": summary(warm_spaced),
                "tool_call_warm_short_keep_alive_ms": summary(warm_short),
                "first_call_ms": summary(first), "resume_on_call_ms": summary(resume)}  # fmt: skip
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


class SampledProvider:
    """The real provider for the real sandboxes, plus in-memory stand-ins (paused, tagged like
    the gateway's) for the rest: listed with the real ones, killed by a dict deletion under
    the same condition a Sandhold server checks (still paused with that endAt)."""

    def __init__(self, real: object, stand_ins: list[ProviderSandbox]) -> None:
        self.real = real
        self.stand_ins = {s.id: s for s in stand_ins}
        self.list_s: list[float] = []
        self.kills = {"real": 0, "stand_in": 0}
        self.real_kill_ms: list[float] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.real, name)

    async def list(self, metadata: dict[str, str]) -> list[ProviderSandbox]:
        t = time.perf_counter()
        out = await self.real.list(metadata)  # type: ignore[attr-defined]
        out += [s for s in self.stand_ins.values()
                if all(s.metadata.get(k) == v for k, v in metadata.items())]  # fmt: skip
        self.list_s.append(time.perf_counter() - t)
        return out

    async def kill(self, sandbox_id: str, if_paused_end_at: float | None = None) -> bool:
        s = self.stand_ins.get(sandbox_id)
        if s is None:
            t = time.perf_counter()
            killed = await self.real.kill(sandbox_id, if_paused_end_at)  # type: ignore[attr-defined]
            self.real_kill_ms.append((time.perf_counter() - t) * 1000)
            self.kills["real"] += 1
            return bool(killed)
        if if_paused_end_at is not None and (s.state != "paused" or s.end_at != if_paused_end_at):
            raise PreconditionFailed(f"sandbox {sandbox_id} changed")
        del self.stand_ins[sandbox_id]
        self.kills["stand_in"] += 1
        return True


async def reclaim_pass_scaled(data_dir: Path, sessions: int, sample: int) -> dict[str, object]:
    os.environ.update(env_for(data_dir, keep_alive=1, retention=0))
    gw = Gateway(Settings())
    async with gw.running(reclaim=False):
        sem = asyncio.Semaphore(8)

        async def one(i: int) -> None:
            async with sem, gw.manager.use("bench", f"p{i}", "bench", 10):
                pass

        await asyncio.gather(*(one(i) for i in range(sample)))
        while True:
            states = [s.state for s in await gw.provider.list(gw.manager.gateway_tags())]
            if states.count("paused") == sample:
                break
            await asyncio.sleep(0.5)
        now = time.time()
        m = gw.manager
        rows, stand_ins = [], []
        for i in range(sample, sessions):
            sid = f"standin-{i:05d}"
            rows.append({"tenant_id": "bench", "session_id": f"p{i}", "state": "open",
                         "generation": 1, "created_at": now, "sandbox_id": sid,
                         "sandbox_handle": {}})  # fmt: skip
            tags = {**m.gateway_tags(), m.tag_tenant: "bench", m.tag_session: f"p{i}"}
            stand_ins.append(ProviderSandbox(sid, "paused", now - 5, now - 10, tags))
        with gw.store.engine.begin() as conn:
            conn.execute(Session.__table__.insert(), rows)
        provider = SampledProvider(gw.provider, stand_ins)
        m.provider = provider  # type: ignore[assignment]
        store_s: list[float] = []
        store_by: dict[str, float] = {}
        db = m.db

        async def timed_db(fn, *args):  # type: ignore[no-untyped-def]
            t = time.perf_counter()
            try:
                return await db(fn, *args)
            finally:
                store_s.append(time.perf_counter() - t)
                name = getattr(fn, "__name__", "?")
                store_by[name] = store_by.get(name, 0.0) + time.perf_counter() - t

        m.db = timed_db  # type: ignore[method-assign]
        report = await gw.reclaimer.run_pass()
        m.db = db  # type: ignore[method-assign]
        m.provider = provider.real  # type: ignore[assignment]
        left = len(await gw.provider.list(gw.manager.gateway_tags()))
    return {"sessions": sessions, "real_sandboxes": sample,
            "stand_ins": sessions - sample, "pass_s": report.seconds,
            "reclaimed": report.reclaimed, "errors": report.errors,
            "provider_list_s": round(sum(provider.list_s), 4),
            "store_calls": len(store_s), "store_s": round(sum(store_s), 4),
            "store_s_by_query": {k: round(v, 4) for k, v in store_by.items()},
            "kills": provider.kills,
            "real_kill_ms": summary(provider.real_kill_ms) if provider.real_kill_ms else None,
            "concurrency": getattr(gw.settings, "gateway_reclaim_concurrency", "16 (fixed)"),
            "real_left_after_pass": left, "stand_ins_left": len(provider.stand_ins)}  # fmt: skip


def main() -> dict[str, object]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=30, help="samples per latency measurement")
    ap.add_argument("--warm", type=int, default=None, help="warm tool calls (default: --n)")
    ap.add_argument("--stores", default="sqlite,postgresql", help="stores of the REST latencies")
    ap.add_argument("--paused", type=int, default=1000, help="real paused sandboxes to reclaim")
    ap.add_argument("--scale", type=int, default=10000, help="sessions of the scaled pass")
    ap.add_argument("--sample", type=int, default=20, help="real sandboxes among them")
    ap.add_argument("--only", default="rest,reclaim,scale", help="steps to run")
    ap.add_argument("--out", default="bench/results/gateway.json")
    ap.add_argument("--before-src", type=Path, help="compare with this src/ (interleaved runs)")
    ap.add_argument("--rounds", type=int, default=3, help="runs per side with --before-src")
    args = ap.parse_args()
    if args.before_src is not None:
        return compare_sides(args)
    warm_n = args.warm or args.n
    result: dict[str, object] = {
        "host": {"kernel": platform.release(), "cpus": os.cpu_count(),
                 "loadavg_1m_at_start": round(os.getloadavg()[0], 2)},
        "provider": "local",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }  # fmt: skip
    only = args.only.split(",")
    steps = []
    for store in args.stores.split(",") if "rest" in only else []:
        steps.append((f"rest_{store}", lambda d, st=store: rest_on(d, args.n, warm_n, st)))
    if "reclaim" in only:
        steps.append(("reclaim_pass", lambda d: asyncio.run(reclaim_pass(d, args.paused))))
    if "scale" in only:
        steps.append(("reclaim_pass_scaled", lambda d: asyncio.run(
            reclaim_pass_scaled(d, args.scale, args.sample))))  # fmt: skip
    for name, fn in steps:
        d = Path(tempfile.mkdtemp(prefix="sandhold-gwbench-", dir="/var/tmp"))
        d.chmod(0o755)
        try:
            out = fn(d)
        finally:
            destroy_data_dir(d)
        print(name, json.dumps(out), flush=True)
        if name == "rest_sqlite":  # where charts.py and compare.py read it
            result.update(out, store="sqlite")
        else:
            result[name] = out
    write_result(args.out, result)
    return result


def rest_on(data_dir: Path, n: int, warm_n: int, store: str) -> dict[str, object]:
    """The REST latencies with the gateway's store on SQLite (its data dir) or PostgreSQL."""
    if store == "sqlite":
        return rest_latencies(data_dir, n, warm_n)
    pg = Postgres()
    pg.start()
    try:
        return rest_latencies(data_dir, n, warm_n, pg.database("gwbench"))
    finally:
        pg.stop()


# The figures compared between the sides: (label, path in a run's JSON; a dict's p50 is taken).
COMPARED = [
    ("warm tool call, SQLite (ms)", ("tool_call_warm_ms",)),
    ("warm tool call, PostgreSQL (ms)", ("rest_postgresql", "tool_call_warm_ms")),
    ("warm tool call 50 ms apart, SQLite (ms)", ("tool_call_warm_spaced_ms",)),
    (
        "warm tool call 50 ms apart, PostgreSQL (ms)",
        ("rest_postgresql", "tool_call_warm_spaced_ms"),
    ),
    ("warm tool call, 1 s keep-alive, SQLite (ms)", ("tool_call_warm_short_keep_alive_ms",)),
    (
        "warm tool call, 1 s keep-alive, PostgreSQL (ms)",
        ("rest_postgresql", "tool_call_warm_short_keep_alive_ms"),
    ),
    ("first call, SQLite (ms)", ("first_call_ms",)),
    ("first call, PostgreSQL (ms)", ("rest_postgresql", "first_call_ms")),
    ("call after auto-pause, SQLite (ms)", ("resume_on_call_ms",)),
    ("call after auto-pause, PostgreSQL (ms)", ("rest_postgresql", "resume_on_call_ms")),
    ("reclaim pass, real sandboxes (s)", ("reclaim_pass", "pass_s")),
    ("reclaim pass, scaled (s)", ("reclaim_pass_scaled", "pass_s")),
]


def _figure(run: dict[str, object], path: tuple[str, ...]) -> float | None:
    value: object = run
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    if isinstance(value, dict):
        value = value.get("p50")
    return float(value) if isinstance(value, int | float) else None


def compare_sides(args: argparse.Namespace) -> dict[str, object]:
    """Run this bench (without --before-src) on both sides, interleaved, and compare them."""
    here = Path(__file__).resolve()
    sides = {"before": args.before_src.resolve(), "after": here.parents[1] / "src"}
    skip = {"--before-src", "--rounds", "--out"}
    argv, it = [], iter(sys.argv[1:])
    for a in it:
        name = a.split("=", 1)[0]
        if name in skip:
            if "=" not in a:
                next(it, None)
            continue
        argv.append(a)
    runs: dict[str, list[dict[str, object]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for side in ("before", "after") if r % 2 == 0 else ("after", "before"):
                out = Path(tmp) / f"{side}-{r}.json"
                env = {**os.environ, "PYTHONPATH": str(sides[side])}
                subprocess.run([sys.executable, str(here), *argv, "--out", str(out)], env=env,
                               check=True, stdout=subprocess.DEVNULL)  # fmt: skip
                runs[side].append(json.loads(out.read_text()))
                print(side, r, {k: _figure(runs[side][-1], p) for k, p in COMPARED}, flush=True)
    figures = {}
    for label, path in COMPARED:
        per = {side: [v for run in runs[side] if (v := _figure(run, path)) is not None]
               for side in runs}  # fmt: skip
        if not per["before"] or not per["after"]:
            continue
        before, after = statistics.median(per["before"]), statistics.median(per["after"])
        figures[label] = {"before": round(before, 4), "after": round(after, 4),
                          "ratio": round(after / before, 3), "runs": per}  # fmt: skip
    result: dict[str, object] = {
        "host": {"kernel": platform.release(), "cpus": os.cpu_count(),
                 "loadavg_1m_at_end": round(os.getloadavg()[0], 2)},
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "sides": {k: str(v) for k, v in sides.items()}, "rounds": args.rounds,
        "figures": figures, "runs": runs,
    }  # fmt: skip
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
