"""What a listing costs per sandbox without HTTP in between: ``Runtime.list()`` and
``SandboxService.query()`` over N live idle ``base`` sandboxes, on one throw-away data dir.

    .venv/bin/python bench/listing_bench.py [--n 300] [--rounds 4] [--listings 20] \\
        [--before-src DIR] [--out bench/results/listing.json]

Each measurement runs in a child process (``--child time``) that opens the runtime on the data
dir (re-attaching to the sandboxes), lists ``--listings`` times each way, and exits; with
``--before-src`` (another tree's ``src/``), children of that tree and of this one alternate
over the same sandboxes for ``--rounds`` rounds, so the host's noise falls on both alike.
Writes each child's p50 per listing and per sandbox (ms, µs), and the medians of each side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchstats import destroy_data_dir, summary, write_result

HERE = Path(__file__).resolve().parents[1] / "src"


def child(mode: str, data_dir: Path, n: int, listings: int) -> dict[str, object]:
    from sandhold.config import Settings
    from sandhold.runtime.runtime import Runtime
    from sandhold.runtime.spec import SandboxSpec
    from sandhold.service import SandboxService

    if mode == "destroy":
        destroy_data_dir(data_dir)  # every sandbox, their cgroups, the dir
        return {"left": data_dir.exists()}
    settings = Settings(data_dir=data_dir)
    rt = Runtime(settings).open()
    if mode == "create":
        for _ in range(n):
            rt.create(SandboxSpec(template="base"))
        return {"created": n}
    service = SandboxService(rt, settings, timers=False)
    found = len(rt.list())  # (warms the record cache, as a running server's is)
    asyncio.run(service.query(None))
    runtime_ms, service_ms = [], []
    for _ in range(listings):
        t = time.perf_counter()
        rt.list()
        runtime_ms.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        asyncio.run(service.query(None))
        service_ms.append((time.perf_counter() - t) * 1000)
    return {"sandboxes": found, "runtime_list_ms": summary(runtime_ms),
            "service_query_ms": summary(service_ms)}  # fmt: skip


def spawn(src: Path, mode: str, data_dir: Path, n: int, listings: int) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": f"{src}:{Path(__file__).parent}"}
    argv = [sys.executable, __file__, "--child", mode, "--data-dir", str(data_dir),
            "--n", str(n), "--listings", str(listings)]  # fmt: skip
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"{mode} child of {src} failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--n", type=int, default=300, help="live sandboxes")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--listings", type=int, default=20, help="listings each way, per child")
    ap.add_argument("--before-src", type=Path, help="alternate with this tree's src/")
    ap.add_argument("--out", default="bench/results/listing.json")
    ap.add_argument("--child", choices=["create", "time", "destroy"], help=argparse.SUPPRESS)
    ap.add_argument("--data-dir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.data_dir, args.n, args.listings)))
        return
    sides = {"after": HERE}
    if args.before_src is not None:
        sides = {"before": args.before_src.resolve(), **sides}
    data_dir = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="sandhold-listing-"))
    runs: list[dict[str, object]] = []
    try:
        spawn(HERE, "create", data_dir, args.n, 0)
        for r in range(args.rounds):
            for side, src in sides.items():
                runs.append({"round": r, "side": side,
                             **spawn(src, "time", data_dir, args.n, args.listings)})  # fmt: skip
                print(json.dumps(runs[-1]), flush=True)
    finally:
        left = spawn(HERE, "destroy", data_dir, 0, 0)["left"]

    def median(side: str, key: str) -> float:
        p50s = [r[key]["p50"] for r in runs if r["side"] == side]  # type: ignore[index]
        return round(statistics.median(p50s), 2)

    medians = {side: {k: median(side, k) for k in ("runtime_list_ms", "service_query_ms")}
               for side in sides}  # fmt: skip
    for m in medians.values():
        m.update({k.replace("_ms", "_us_per_sandbox"): round(v * 1000 / args.n, 1)
                  for k, v in list(m.items())})  # fmt: skip
    result = {"args": vars(args) | {"before_src": str(args.before_src)}, "sides":
              {k: str(v) for k, v in sides.items()}, "runs": runs, "medians": medians,
              "data_dir_left": left}  # fmt: skip
    write_result(args.out, result)


if __name__ == "__main__":
    main()
