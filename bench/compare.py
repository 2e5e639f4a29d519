"""Before/after in one run: the same benchmarks of two source trees, each tree's own
``bench/*.py`` against its own ``src/`` (the bench scripts change with the APIs they call), with
one Python (the dependencies are the same), interleaved (before, after, before, after, ... for
each script, for R rounds) so that the shared machine's noise falls on both alike.

    git worktree add --detach /tmp/sandhold-before <commit>
    git worktree add --detach /tmp/sandhold-after HEAD
    .venv/bin/python bench/compare.py /tmp/sandhold-before /tmp/sandhold-after \\
        [--rounds 3] [--n 20] [--out bench/results/compare.json]

Runs as root (the benchmarks make cgroups). Each run gets ``PYTHONPATH=<tree>/src``, no
``SANDHOLD_*`` variables (so each benchmark derives its own cgroup group from its own throw-away
data dir), its own ``TMPDIR``, its own process group (whatever of it outlives the run is
reported and killed), and is checked for what it left behind: its data dirs, their cgroup
groups, mounts under them. Writes, per measure, each round's p50/p95 before and after, the
median p50 of each side over the rounds, and the ratio after/before (< 1 is faster).
Times are milliseconds. Exits 1 if a run failed or left something behind (the JSON says what).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

SIDES = ("before", "after")
RUN_FIELDS = ("round", "bench", "side", "rc", "seconds", "data_dirs", "left_behind",
              "loadavg_1m_at_end")  # fmt: skip
CGROUP_ROOT = Path("/sys/fs/cgroup")
# The data dirs the benchmarks make for themselves (tempfile.mkdtemp in /var/tmp).
BENCH_DIR_PREFIXES = ("sandhold-bench-", "sandhold-e2b-bench-", "sandhold-gwbench-")

# Script, its extra arguments (the expensive parts made small), then (result key, label).
# A key with a dot is a field of a nested result; a value without p50/p95 is taken as the p50.
BENCHES: dict[str, tuple[list[str], list[tuple[str, str]]]] = {
    "runtime": (
        ["bench/runtime_bench.py", "--idle", "0"],
        [
            ("floor_python3_pass_ms", "floor: bare `python3 -c pass`"),
            ("floor_bwrap_true_ms", "floor: bare `bwrap --unshare-all true`"),
            ("create_to_ready_ms", "runtime: create → agent ready"),
            ("create_to_first_command_ms", "runtime: create → first command answered"),
            ("command_roundtrip_true_ms", "runtime: command round trip (`/bin/true`)"),
            ("command_roundtrip_bash_login_ms", "runtime: command round trip (`bash -l -c true`)"),
            ("pause_ms", "runtime: pause"),
            ("resume_ms", "runtime: resume"),
            ("kill_ms", "runtime: kill"),
        ],
    ),
    "e2b": (
        ["bench/e2b_bench.py", "--concurrency", "2"],
        [
            ("create_to_ready_ms", "E2B SDK: `Sandbox.create()`"),
            ("kill_ms", "E2B SDK: `kill()`"),
            ("command_run_true_ms", 'E2B SDK: `commands.run("true")`'),
            ("command_run_true_direct_agent_ms", "the same, straight on the agent socket"),
            ("files_write_read_1kib_ms", "E2B SDK: `files.write` + `files.read`, 1 KiB"),
            ("pause_ms", "E2B SDK: `pause()`"),
            ("resume_via_connect_ms", "E2B SDK: resume through `connect()`"),
            ("pause_resume_run_roundtrip_ms", "E2B SDK: pause → connect → run"),
            ("session_create_run_kill_ms", "E2B SDK: create → run → kill"),
            ("concurrent_creates.create_latency_ms", "E2B SDK: create, 2 concurrent clients"),
        ],
    ),
    "gateway": (
        ["bench/gateway_bench.py", "--paused", "20"],
        [
            ("tool_call_warm_ms", "gateway: tool call, warm sandbox"),
            ("first_call_ms", "gateway: first call of a session (create + run)"),
            ("resume_on_call_ms", "gateway: first call after auto-pause (resume + run)"),
            ("reclaim_pass.per_sandbox_ms", "gateway: reclaim pass, per paused sandbox"),
        ],
    ),
}


def bench_dirs() -> set[Path]:
    return {p for pre in BENCH_DIR_PREFIXES for p in Path("/var/tmp").glob(pre + "*")}


def cgroup_group_of(data_dir: Path) -> str:
    """The parent cgroup a runtime on this data dir uses (RuntimeSettings.cgroup_group in both
    trees, with no cgroup_parent set)."""
    return "sandhold-" + hashlib.sha256(str(data_dir).encode()).hexdigest()[:10]


def cgroup_groups() -> set[Path]:
    roots = [CGROUP_ROOT] + [p for p in CGROUP_ROOT.iterdir() if p.is_dir()]
    return {g for r in roots for g in r.glob("sandhold-*") if g.is_dir()}


def mount_points() -> list[str]:
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line.split()[4] for line in lines]


def group_members(pgid: int) -> list[tuple[str, str]]:
    """The processes of a process group still there: (state, description) of each."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            cmd = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
        except OSError:
            continue
        comm, fields = text[text.index("(") + 1 : text.rindex(")")], text.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid:
            out.append((fields[0], f"{stat.parent.name} {comm} ppid {fields[1]}: {cmd.strip()}"))
    return out


def end_group(pgid: int) -> tuple[list[str], list[str]]:
    """After a run: kill what of its process group still runs (a benchmark's children that
    outlived it), then give init a few seconds to reap its zombies (children a subreaper did not
    wait for, reparented when it exited). Returns (killed, zombies still there)."""
    running = [d for state, d in group_members(pgid) if state != "Z"]
    if running:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while (members := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return running, [d for _, d in members]


def run_one(
    tree: Path, bench: str, n: int, run_dir: Path, python: str, timeout: float
) -> dict[str, Any]:
    script_args, _ = BENCHES[bench]
    run_dir.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_")}
    env.update(PYTHONPATH=str(tree / "src"), TMPDIR=str(run_dir))
    out = run_dir / "result.json"
    argv = [python, *script_args, "--n", str(n), "--out", str(out)]
    dirs_before, groups_before = bench_dirs(), cgroup_groups()
    seen: set[Path] = set()
    t = time.monotonic()
    with (run_dir / "output.log").open("wb") as log:
        proc = subprocess.Popen(argv, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        rc: int | None = None
        while (rc := proc.poll()) is None and time.monotonic() - t < timeout:
            seen |= bench_dirs() - dirs_before  # the bench's own data dirs, while they exist
            time.sleep(0.2)
    seconds = round(time.monotonic() - t, 1)
    if rc is None:  # timed out
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    killed, zombies = end_group(proc.pid)  # its process group (pgid == its pid)
    ours = {cgroup_group_of(d) for d in seen}
    left = [f"dir {d}" for d in sorted(seen & bench_dirs())]
    left += [f"cgroup {g}" for g in sorted(cgroup_groups() - groups_before) if g.name in ours]
    left += [f"mount {m}" for m in mount_points() if any(m.startswith(str(d)) for d in seen)]
    left += [f"process (outlived the run; killed) {p}" for p in killed]
    left += [f"zombie {p}" for p in zombies]
    doc = json.loads(out.read_text()) if rc == 0 and out.exists() else None
    return {
        "rc": rc,
        "seconds": seconds,
        "data_dirs": sorted(str(d) for d in seen),
        "left_behind": left,
        "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
        "result": doc,
        "log_tail": None if doc else (run_dir / "output.log").read_text()[-3000:],
    }


def pick(doc: dict[str, Any], key: str) -> tuple[float, float | None]:
    value: Any = doc
    for part in key.split("."):
        value = value[part]
    if isinstance(value, dict):
        return value["p50"], value["p95"]
    return float(value), None


def git_head(tree: Path) -> str:
    r = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True,
                       text=True, check=False)  # fmt: skip
    return r.stdout.strip() or "unknown (not a git tree)"


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    measures: dict[str, Any] = {}
    for bench, (_, keys) in BENCHES.items():
        for key, label in keys:
            m: dict[str, Any] = {"bench": bench, "key": key, "label": label}
            for side in SIDES:
                rounds = []
                for run in runs:
                    if run["bench"] == bench and run["side"] == side and run["result"]:
                        p50, p95 = pick(run["result"], key)
                        rounds.append({"round": run["round"], "p50": p50, "p95": p95})
                p50s = [r["p50"] for r in rounds]
                m[side] = {
                    "rounds": rounds,
                    "median_p50": round(statistics.median(p50s), 2) if p50s else None,
                }
            b, a = m["before"]["median_p50"], m["after"]["median_p50"]
            m["ratio"] = round(a / b, 3) if a is not None and b else None
            measures[f"{bench}.{key}"] = m
    return measures


def markdown(measures: dict[str, Any]) -> str:
    rows = ["| measure | before p50 | after p50 | ratio |", "|---|---|---|---|"]
    for m in measures.values():
        b, a, r = m["before"]["median_p50"], m["after"]["median_p50"], m["ratio"]
        rows.append(f"| {m['label']} | {b} | {a} | {r:.2f} |" if r is not None else
                    f"| {m['label']} | {b} | {a} | - |")  # fmt: skip
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path, help="source tree measured as 'before'")
    ap.add_argument("after", type=Path, help="source tree measured as 'after'")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=20, help="samples per measure, per run")
    ap.add_argument("--bench", action="append", choices=list(BENCHES), help="default: all")
    ap.add_argument("--python", default=sys.executable, help="interpreter for both trees")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per benchmark run")
    ap.add_argument("--out", default="bench/results/compare.json")
    ap.add_argument("--keep", action="store_true", help="keep each run's output and log")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("compare.py: the benchmarks need root (cgroups, sandbox uids)", file=sys.stderr)
        return 1
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    for tree in trees.values():
        if not (tree / "src" / "sandhold").is_dir() or not (tree / "bench").is_dir():
            print(f"compare.py: {tree} is not a Sandhold source tree", file=sys.stderr)
            return 1
    benches = args.bench or list(BENCHES)
    work = Path(tempfile.mkdtemp(prefix="sandhold-compare-", dir="/var/tmp"))
    started = datetime.now(UTC)
    t0 = time.monotonic()
    load0 = round(os.getloadavg()[0], 2)
    runs: list[dict[str, Any]] = []
    for rnd in range(1, args.rounds + 1):
        for bench in benches:
            for side in SIDES:
                d = work / f"round{rnd}-{bench}-{side}"
                run = run_one(trees[side], bench, args.n, d, args.python, args.timeout)
                run.update(round=rnd, bench=bench, side=side)
                runs.append(run)
                status = "ok" if run["result"] else f"FAILED (rc {run['rc']})"
                print(f"round {rnd} {bench:8} {side:6} {run['seconds']:6.1f} s {status}"
                      + (f"  left behind: {run['left_behind']}" if run["left_behind"] else ""),
                      file=sys.stderr, flush=True)  # fmt: skip
                if not run["result"]:
                    print(run["log_tail"], file=sys.stderr)
    measures = summarise([r for r in runs if r["bench"] in benches])
    failed = [r for r in runs if not r["result"]]
    result = {
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "started": started.isoformat(timespec="seconds"),
        "total_s": round(time.monotonic() - t0, 1),
        "host": {
            "kernel": platform.release(),
            "cpus": os.cpu_count(),
            "loadavg_1m_at_start": load0,
            "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
        },
        "python": args.python,
        "trees": {s: {"path": str(t), "commit": git_head(t)} for s, t in trees.items()},
        "rounds": args.rounds,
        "n": args.n,
        "bench_args": {b: BENCHES[b][0][1:] for b in benches},
        "order": "per round, per script: before then after",
        "runs": [{k: r[k] for k in RUN_FIELDS} for r in runs],
        "failed_runs": len(failed),
        "left_behind": sorted({x for r in runs for x in r["left_behind"]}),
        "measures": {k: m for k, m in measures.items() if m["bench"] in benches},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(markdown(result["measures"]))
    print(f"\n{len(runs)} runs in {result['total_s']} s, {len(failed)} failed, "
          f"left behind: {result['left_behind'] or 'nothing'}; written to {out}")  # fmt: skip
    if args.keep or failed:
        print(f"runs' output kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed or result["left_behind"] else 0


if __name__ == "__main__":
    sys.exit(main())
