"""The fleet's costs (docs/fleet.md), through the official e2b SDK, on this one machine: three
fleet hosts, edges over a PostgreSQL catalog, moto as the shared store.

    .venv/bin/python bench/fleet_bench.py [--n 40] [--interpreter] [--out bench/results/fleet.json]

Measures, each comparison sample by sample alternately in one run:
- the edge's overhead: ``Sandbox.create()`` through an edge vs a plain `sandhold serve`, and
  ``commands.run("true")`` on one sandbox through the edge vs straight to its host;
- placement: the decision (``placement.order``) over 100 and 1,000 hosts;
- drain (SIGTERM to exit, a running sandbox stored and handed over) and migrate-and-resume (the
  first command after it, through the edge, on another host) of a bare sandbox and, with
  ``--interpreter``, of a code-interpreter sandbox (``run_code``);
- creates per second from 10 concurrent clients with 1, 2 and 3 hosts behind the edge (the hosts
  share this machine's 2 CPUs: the figure shows the edge's and the catalog's share, not scale).
"""

from __future__ import annotations

import argparse
import functools
import random
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from e2b import Sandbox
from tests.fleet.harness import Edge, host_of, new_host, s3_store
from tests.gateway.postgres import Postgres
from tests.support.e2b_server import KEY_A, new_server
from tests.support.interpreter import InterpreterServer

from benchstats import summary, write_result
from sandhold.fleet.placement import Candidate, order


def ms(fn) -> float:  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


def overhead(edge: Edge, plain, hosts, n: int) -> dict[str, object]:  # type: ignore[no-untyped-def]
    via_edge, direct = [], []
    for _ in range(n):
        for side, out in ((edge.sdk(), via_edge), (plain.sdk(), direct)):
            made: list[Sandbox] = []
            out.append(ms(lambda s=side, m=made: m.append(Sandbox.create(**s))))
            made[0].kill()
    sbx = Sandbox.create(timeout=600, **edge.sdk())
    host = next(h for h in hosts if host_of(h, sbx.sandbox_id))
    straight = Sandbox.connect(sbx.sandbox_id, api_key=KEY_A, api_url=edge.url,
                               sandbox_url=host.url)  # fmt: skip
    run_edge, run_direct = [], []
    for _ in range(n * 5):
        run_edge.append(ms(lambda: sbx.commands.run("true")))
        run_direct.append(ms(lambda: straight.commands.run("true")))
    sbx.kill()
    ce, cd, re_, rd = (summary(x) for x in (via_edge, direct, run_edge, run_direct))
    return {
        "create_edge": ce, "create_direct": cd,
        "create_added_ms_p50": round(ce["p50"] - cd["p50"], 2),
        "run_edge": re_, "run_direct": rd,
        "run_added_ms_p50": round(re_["p50"] - rd["p50"], 2),
        "run_ratio_p50": round(re_["p50"] / rd["p50"], 3),
    }  # fmt: skip


def placement() -> dict[str, object]:
    out: dict[str, object] = {}
    rng = random.Random(7)
    for n in (100, 1000):
        hosts = [Candidate(f"h{i}", f"http://h{i}", 64, rng.randrange(64)) for i in range(n)]
        samples = [ms(lambda h=hosts: order(h, 3, rng=rng)) for _ in range(200)]
        out[f"order_{n}_hosts"] = summary(samples)
    return out


def moves(edge: Edge, hosts, interpreter: bool) -> dict[str, object]:  # type: ignore[no-untyped-def]
    out: dict[str, object] = {}
    kinds = ["bare", "interpreter"] if interpreter else ["bare"]
    for kind in kinds:
        if kind == "interpreter":
            from e2b_code_interpreter import Sandbox as CodeSandbox

            sbx = CodeSandbox.create(timeout=600, **edge.sdk())
            sbx.run_code("x = 41")
            first = lambda s: s.run_code("x + 1")  # noqa: E731
        else:
            sbx = Sandbox.create(timeout=600, **edge.sdk())
            sbx.commands.run("echo kept > /tmp/kept")
            first = lambda s: s.commands.run("cat /tmp/kept")  # noqa: E731
        host = next(h for h in hosts if h.proc and host_of(h, sbx.sandbox_id))
        t = time.perf_counter()
        host.proc.send_signal(signal.SIGTERM)
        host.proc.wait(300)
        drained = (time.perf_counter() - t) * 1000
        host.sock.close()  # its port refuses, as a stopped node's
        t = time.perf_counter()
        first(sbx)  # through the edge: taken up on another host, resumed, answered
        moved = (time.perf_counter() - t) * 1000
        out[kind] = {"drain_ms": round(drained, 1), "migrate_and_first_call_ms": round(moved, 1)}
        sbx.kill()  # (its host stays down: three hosts allow two moves)
    return out


def _create(sdk: dict[str, str], _: int) -> Sandbox:
    return Sandbox.create(**sdk)


def creates_per_second(tmp: Path, url: str, hosts, n: int) -> dict[str, object]:  # type: ignore[no-untyped-def]
    out: dict[str, object] = {}
    for k in (1, 2, 3):
        edge = Edge(tmp, url, hosts[:k])
        edge.start()
        try:
            with ThreadPoolExecutor(10) as pool:
                t = time.perf_counter()
                made = list(pool.map(functools.partial(_create, edge.sdk()), range(n)))
                rate = n / (time.perf_counter() - t)
            out[f"{k}_hosts"] = round(rate, 1)
            with ThreadPoolExecutor(10) as pool:
                list(pool.map(lambda s: s.kill(), made))
        finally:
            edge.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--interpreter", action="store_true")
    ap.add_argument("--out", default="bench/results/fleet.json")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sandhold-fleet-bench-", dir="/var/tmp"))
    pg = Postgres()
    pg.start()
    hosts, edge, plain = [], None, None
    try:
        with s3_store() as store:
            for i in (1, 2, 3):
                h = new_host(tmp, f"b{i}", capacity=64, fleet_store_after_s="0.5", **store)
                if args.interpreter:
                    h.__class__ = InterpreterServer
                    h.build_template()  # type: ignore[attr-defined]
                hosts.append(h)
                h.start()
            plain = new_server(tmp)
            plain.start()
            url = pg.database("fleet")
            edge = Edge(tmp, url, hosts)
            edge.start()
            result = {
                "overhead": overhead(edge, plain, hosts, args.n),
                "placement": placement(),
                "creates_per_second": creates_per_second(tmp, url, hosts, args.n),
                "moves": moves(edge, hosts, args.interpreter),
            }
    finally:
        if edge is not None:
            edge.stop()
        for h in [*hosts, *([plain] if plain else [])]:
            h.destroy()
        pg.stop()
    write_result(args.out, result)


if __name__ == "__main__":
    main()
