"""Fork and snapshot benchmarks, on a throw-away data dir under /var/tmp.

    .venv/bin/python bench/fork_bench.py [--n 5] [--out bench/results/fork.json]

Per round, rotated: a bare ``base`` sandbox after its first command, and an idle
``code-interpreter-v1`` one (1024 MiB limit; the template built from the wheel cache of --cache,
as bench/interpreter_bench.py does; ``x = 41`` run in its kernel; how it started, cold or warm,
recorded). Of each source:

- ``Runtime.fork(source, [{}] * count)`` for count 1 and 10: the call's wall time, the source's
  pause (the call of ``fork.checkpoint_in_place``: quiesce, freeze, layer copy, ``criu dump``,
  thaw, socket handed back), each fork's ``fork.start`` (layer copy, uid shift, images copied,
  ``criu restore``, handoff) and when in the call it was done, then each fork's first answer
  (``/bin/true`` through the agent, or ``run_code("x + 1")`` on port 49999, which must be 42),
  asked one fork after another once the call has returned; forks that failed are counted.
- ``full`` and ``filesystem`` snapshots (checkpoint/snapshots.py): take time, the source's pause,
  size on disk (du of the snapshot's directory), and a sandbox started from it to its first
  answer (``x + 1`` for a full one, ``1+1`` / ``/bin/true`` for a filesystem one: a fresh boot).

Every sandbox of a round is killed, and its snapshots deleted, before the next one; round 0 warms
every path and is not counted. It kills everything and removes the data dir at the end, on an
exception or Ctrl-C too. Times are milliseconds; prints one JSON document and writes it to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchstats import summary, write_result
from sandhold.config import Settings
from sandhold.errors import SandholdError
from sandhold.interpreter.template import TEMPLATE_NAME
from sandhold.interpreter.template import build_code_interpreter_template as build_interpreter
from sandhold.runtime import images
from sandhold.runtime.checkpoint import fork, process_tree
from sandhold.runtime.checkpoint.criu import criu_status
from sandhold.runtime.checkpoint.snapshots import SnapshotStore
from sandhold.runtime.records import SandboxInfo
from sandhold.runtime.runtime import Runtime
from suspend_bench import anon, disk_kib, first_answer, load, meminfo, throwaway_runtime

KINDS: dict[str, dict[str, Any]] = {
    "base": {},
    TEMPLATE_NAME: {"template": TEMPLATE_NAME, "limits": {"memory_mb": 1024}},
}
COUNTS = (1, 10)
# The calls timed: the two a fork is made of, and the steps inside them (nested steps are
# counted in both: prepare_root holds a fork's copy_layer and shift_tree).
OUTER = {"checkpoint": (fork, "checkpoint_in_place"), "start": (fork, "start")}
INNER = {"quiesce": (process_tree, "quiesce"), "copy_layer": (images, "copy_sparse"),
         "dump": (process_tree, "dump"), "copy_images": (process_tree, "copy_images"),
         "restore": (process_tree, "restore"), "handoff": (fork, "hand_back")}  # fmt: skip


class Steps:
    """Wraps the fork module's ``checkpoint_in_place`` and ``start`` (fork, snapshots and warm
    starts call them through the module) and the steps they make, to time each call."""

    def __init__(self, rt: Runtime) -> None:
        self.calls: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        inner = INNER | {"prepare_root": (rt, "_prepare_root"),
                         "shift_tree": (rt.uids, "shift_tree")}  # fmt: skip
        for name, (obj, attr) in OUTER.items():
            setattr(obj, attr, self._timed(name, getattr(obj, attr), outer=True))
        for name, (obj, attr) in inner.items():
            setattr(obj, attr, self._timed(name, getattr(obj, attr), outer=False))

    def _timed(self, name: str, fn: Callable[..., Any], outer: bool) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            if outer:
                self._open = {"call": name, "t0": t, "steps": {}, "ok": False}
                self.calls.append(self._open)
            try:
                out = fn(*a, **kw)
                if outer and self._open is not None:
                    self._open["ok"] = True
                return out
            finally:
                end = time.perf_counter()
                if outer and self._open is not None:
                    self._open |= {"end": end, "ms": (end - t) * 1000}
                    self._open = None
                elif self._open is not None:
                    steps = self._open["steps"]
                    steps[name] = steps.get(name, 0) + (end - t) * 1000

        return wrapper

    def take(self, call: str | None = None) -> list[dict[str, Any]]:
        out, self.calls = self.calls, []
        return [c for c in out if call is None or c["call"] == call]


def pause_of(calls: list[dict[str, Any]]) -> dict[str, Any]:
    c = next((c for c in calls if c["call"] == "checkpoint"), None)
    return {} if c is None else {"source_pause_ms": c["ms"], "source_pause_steps_ms": c["steps"]}


async def answer(info: SandboxInfo, interpreter: bool, code: str) -> tuple[float, bool, str]:
    """Time of the first answer (ms), whether it is the right one, and what it was."""
    want = {"x + 1": "42", "1+1": "2"}[code] if interpreter else "exit 0"
    t = time.perf_counter()
    try:
        got = await first_answer(info, interpreter, code)
    except Exception as e:
        got = f"{type(e).__name__}: {e}"
    return (time.perf_counter() - t) * 1000, got == want, got


async def forks(rt: Runtime, steps: Steps, source: SandboxInfo, count: int,
                interpreter: bool) -> dict[str, Any]:  # fmt: skip
    steps.take()
    t = time.perf_counter()
    try:
        made = rt.fork(source.id, [{}] * count)
    except SandholdError as e:
        return {"call_failed_ms": (time.perf_counter() - t) * 1000, "error": anon(str(e)),
                "requested": count, "failed": count} | pause_of(steps.take())  # fmt: skip
    call_ms = (time.perf_counter() - t) * 1000
    calls = steps.take()
    out: dict[str, Any] = {"call_ms": call_ms, "requested": count, **pause_of(calls)}
    out["start_ms"] = [c["ms"] for c in calls if c["call"] == "start"]
    out["start_steps_ms"] = [c["steps"] for c in calls if c["call"] == "start" and c["ok"]]
    out["ready_in_call_ms"] = [(c["end"] - t) * 1000 for c in calls if c["call"] == "start"]
    errors = [anon(str(r)) for r in made if not isinstance(r, SandboxInfo)]
    ok = [r for r in made if isinstance(r, SandboxInfo)]
    out["answer_ms"], out["call_to_answer_ms"] = [], []
    try:
        for info in ok:  # one after another: each measured alone
            ms, right, got = await answer(info, interpreter, "x + 1")
            if not right:
                errors.append(f"{info.id} answered {anon(got)[:300]!r}")
                continue
            out["answer_ms"].append(ms)
            out["call_to_answer_ms"].append(call_ms + ms)
    finally:
        for info in ok:
            rt.kill(info.id)
    out["failed"], out["errors"] = len(errors), errors
    return out


async def snapshot(rt: Runtime, steps: Steps, source: SandboxInfo, mode: str,
                   interpreter: bool) -> dict[str, Any]:  # fmt: skip
    store = SnapshotStore(rt)
    steps.take()
    t = time.perf_counter()
    try:
        snap = store.take(source.id, "bench", None, mode)  # type: ignore[arg-type]
    except SandholdError as e:
        return {"take_failed_ms": (time.perf_counter() - t) * 1000, "error": anon(str(e))}
    out: dict[str, Any] = {"take_ms": (time.perf_counter() - t) * 1000, **pause_of(steps.take())}
    out["size_kib"], out["size_bytes"] = disk_kib(snap.dir), snap.size_bytes
    try:
        t = time.perf_counter()
        try:
            info = store.start(snap, {})
        except SandholdError as e:
            return out | {"start_failed_ms": (time.perf_counter() - t) * 1000,
                          "error": anon(str(e))}  # fmt: skip
        out["start_ms"] = (time.perf_counter() - t) * 1000
        try:
            ms, right, got = await answer(info, interpreter, "x + 1" if mode == "full" else "1+1")
            out["start_to_first_answer_ms"] = out["start_ms"] + ms
            if not right:
                out["error"] = f"answered {anon(got)[:300]!r}"
        finally:
            rt.kill(info.id)
    finally:
        store.delete(snap.id)
    return out


async def round_of(rt: Runtime, steps: Steps, kind: str) -> dict[str, Any]:
    interpreter = kind == TEMPLATE_NAME
    source = rt.create(KINDS[kind])
    out: dict[str, Any] = {"source_started_from": source.started_from or "cold"}
    try:
        if interpreter:
            await first_answer(source, True, "x = 41")  # (its kernel is up: state to fork)
        else:
            await first_answer(source, False)
        for count in COUNTS:
            out[f"fork_{count}"] = await forks(rt, steps, source, count, interpreter)
        out["source_answers_after_forks"] = (await answer(source, interpreter, "x + 1"))[1]
        for mode in ("full", "filesystem"):
            out[f"snapshot_{mode}"] = await snapshot(rt, steps, source, mode, interpreter)
        return out
    finally:
        rt.kill(source.id)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def col(vals: list[float]) -> dict[str, float] | None:
        return summary(vals) if vals else None

    def flat(key: str, k: str) -> list[float]:  # a list per run, or one value
        vals = [r[key].get(k) for r in runs]
        return [x for v in vals if v is not None for x in (v if isinstance(v, list) else [v])]

    def split(key: str, k: str) -> dict[str, Any]:
        rows = flat(key, k)
        names = sorted({s for row in rows for s in row})  # type: ignore[attr-defined]
        return {s: col([row[s] for row in rows if s in row]) for s in names}  # type: ignore[index]

    out: dict[str, Any] = {"rounds": len(runs),
                           "source_started_from": sorted({r["source_started_from"] for r in runs}),
                           "source_answers_after_forks": sum(r["source_answers_after_forks"]
                                                             for r in runs)}  # fmt: skip
    for count in COUNTS:
        key = f"fork_{count}"
        f = out[key] = {"forks_requested": sum(r[key]["requested"] for r in runs),
                        "forks_failed": sum(r[key]["failed"] for r in runs)}  # fmt: skip
        for k in ("call_ms", "call_failed_ms", "source_pause_ms", "start_ms", "ready_in_call_ms",
                  "answer_ms", "call_to_answer_ms"):  # fmt: skip
            f[k] = col(flat(key, k))
        f["source_pause_steps_ms"] = split(key, "source_pause_steps_ms")
        f["start_steps_ms"] = split(key, "start_steps_ms")
        f["errors"] = sorted({e for r in runs for e in r[key].get("errors", [])} |
                             {r[key]["error"] for r in runs if "error" in r[key]})  # fmt: skip
    for mode in ("full", "filesystem"):
        key = f"snapshot_{mode}"
        s = out[key] = {k: col(flat(key, k)) for k in ("take_ms", "source_pause_ms", "size_kib",
                        "start_ms", "start_to_first_answer_ms", "take_failed_ms",
                        "start_failed_ms")}  # fmt: skip
        s["source_pause_steps_ms"] = split(key, "source_pause_steps_ms")
        s["errors"] = sorted({r[key]["error"] for r in runs if "error" in r[key]})
    return out


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"n": args.n, "load_start": load()}
    with throwaway_runtime(args.criu) as rt:
        result["criu"] = criu_status(rt.settings.criu_path)[1]
        steps = Steps(rt)
        t = time.perf_counter()
        build_interpreter(rt.templates, cache_dir=Path(args.cache))
        result["interpreter_template_build_s"] = round(time.perf_counter() - t, 1)
        runs: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
        for i in range(args.n + 1):  # round 0 warms every path and is not counted
            order = list(runs)[i % len(runs) :] + list(runs)[: i % len(runs)]  # rotated
            for kind in order:
                r = await round_of(rt, steps, kind)
                if i:
                    runs[kind].append(r)
            print(f"round {i}/{args.n}", file=sys.stderr)
        result |= {kind: summarize(rs) for kind, rs in runs.items()}
    result["load_end"] = load()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=5, help="rounds of each kind of source")
    ap.add_argument("--out", default="bench/results/fork.json")
    ap.add_argument("--criu", default=None, help="CRIU binary (default: settings.criu_path)")
    ap.add_argument("--cache", default="/var/tmp/sandhold-cache/interpreter")
    args = ap.parse_args()
    ok, detail = criu_status(Path(args.criu) if args.criu else Settings().criu_path)
    if not ok:
        raise SystemExit(f"CRIU unusable, nothing to fork: {detail}")
    result = {"host": {"kernel": platform.release(), "cpus": os.cpu_count(),
                       "mem_total_mib": meminfo()["MemTotal"] // 1024}}  # fmt: skip
    result |= asyncio.run(bench(args))
    write_result(args.out, result)


if __name__ == "__main__":
    main()
