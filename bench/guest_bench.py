"""The runtime on the cgroup v2 guest against this (v1) host, in one run each: create → ready,
pause, resume, kill and the idle cgroup memory per sandbox. The guest emulates its CPU (TCG), so
its absolute times mean nothing: each time is also given as a ratio to the same machine's own
``bwrap /bin/true`` floor, measured in the same run.

    .venv/bin/python bench/guest_bench.py [--n 10] [--idle 5] [--out bench/results/cgroup_v2.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchstats import write_result

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.support import guest  # noqa: E402

MEASURES = ("create_to_ready_ms", "pause_ms", "resume_ms", "kill_ms")


def on_host(n: int, idle: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "runtime.json"
        subprocess.run([sys.executable, "bench/runtime_bench.py", "--n", str(n), "--idle",
                        str(idle), "--out", str(out)], cwd=REPO, check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        return dict(json.loads(out.read_text()))


def in_guest(n: int, idle: int) -> dict[str, object]:
    command = (f"{sys.executable} bench/runtime_bench.py --n {n} --idle {idle} "
               "--out /mnt/guest/runtime.json >/mnt/guest/bench.log 2>&1; "
               "cat /mnt/guest/runtime.json || tail -50 /mnt/guest/bench.log")  # fmt: skip
    r = guest.run(command, cwd=REPO, timeout_s=3600)
    if r.status != 0:
        raise SystemExit(f"the guest's run failed:\n{r.output[-3000:]}\n{r.console[-2000:]}")
    return dict(json.loads(r.output))


def figures(result: dict[str, object]) -> dict[str, object]:
    floor = result["floor_bwrap_true_ms"]["p50"]  # type: ignore[index]
    out: dict[str, object] = {"floor_bwrap_true_ms": floor}
    for key in MEASURES:
        p50 = result[key]["p50"]  # type: ignore[index]
        out[key] = {"p50": p50, "ratio_to_floor": round(p50 / floor, 2)}
    idle = result.get("idle") or {}
    out["idle_cgroup_memory_per_sandbox_mib"] = idle.get("cgroup_memory_per_sandbox_mib")  # type: ignore[union-attr]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--idle", type=int, default=5)
    ap.add_argument("--out", default="bench/results/cgroup_v2.json")
    args = ap.parse_args()
    kit = guest.kit()
    host, vm = on_host(args.n, args.idle), in_guest(args.n, args.idle)
    write_result(args.out, {
        "command": " ".join(sys.argv),
        "guest_kernel": kit.release,
        "host_v1": figures(host),
        "guest_v2": figures(vm),
    })  # fmt: skip


if __name__ == "__main__":
    main()
