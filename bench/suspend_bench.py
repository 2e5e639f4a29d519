"""Suspend-to-disk benchmarks (issue 13), on a throw-away data dir under /var/tmp.

    .venv/bin/python bench/suspend_bench.py latency [--n 20]      # -> bench/results/suspend.json
    .venv/bin/python bench/suspend_bench.py density [--live 200] [--suspended 1000]
                                                                  # -> bench/results/density.json

``latency``: a bare ``base`` sandbox, the same holding 64 MiB in one process, and an idle
``code-interpreter-v1`` one (the template is built from the wheel cache of --cache, as the
interpreter tests and bench/interpreter_bench.py do), rotated per round: pause (freezer),
suspend from paused as the server's suspender does (thaw, quiesce, criu dump), resume from disk
(criu restore + the agent's socket handoff), the first command (``/bin/true``) or first
``run_code`` result after it, the image's size on disk, and host memory (cgroup usage, PSS of
the processes) before suspending, suspended and after. Each suspend and resume is split into its
steps by timing the calls of checkpoint/process_tree.py. A dump or restore that fails is recorded
with CRIU's Error lines (its log is copied first: the runtime removes a failed dump's log with
the partial image); after a failed dump the sandbox is checked to be paused in the freezer and
to carry on once resumed.

``density``: N live idle sandboxes, then M created and suspended one by one, with host memory
(MemTotal - MemAvailable of /proc/meminfo) before and after each, the memory still charged to the
suspended ones' cgroups, their disk (image, writable layer), the time of each suspend, a sample
resumed at the end. It refuses to start, and stops creating, where the data dir's filesystem
would pass --max-disk-fill (df's use%: used / (used + available)).

Both kill every sandbox and remove the data dir at the end, on an exception or Ctrl-C too.
Times are milliseconds; prints one JSON document and writes it to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import functools
import os
import platform
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from benchstats import pss_kib, summary, write_result
from sandhold.config import Settings
from sandhold.envd.client import EnvdClient
from sandhold.envd.transports import agent_channel
from sandhold.errors import CheckpointFailed
from sandhold.interpreter.template import SERVICE_PORT, TEMPLATE_NAME
from sandhold.interpreter.template import build_code_interpreter_template as build_interpreter
from sandhold.runtime import cgroups
from sandhold.runtime.checkpoint import process_tree
from sandhold.runtime.checkpoint.criu import criu_status
from sandhold.runtime.client import AgentClient
from sandhold.runtime.records import SandboxInfo
from sandhold.runtime.runtime import Runtime

MIB = 2**20
# Time spent in each of these calls of runtime/checkpoint/process_tree.py, per suspend or resume.
STEPS = ("quiesce", "dump", "restore", "handoff")


class Steps:
    """Wraps the checkpoint module's steps to time them (``checkpoint/suspend.py`` calls them
    through the module), and copies the log of a dump or restore that fails."""

    def __init__(self, logs: Path) -> None:
        self.current: dict[str, float] = {}
        self.logs, self.failed_logs = logs, 0
        for name in STEPS:
            setattr(process_tree, name, self._timed(name, getattr(process_tree, name)))

    def _timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            except CheckpointFailed:
                if name in ("dump", "restore"):  # keep its log before the runtime removes it
                    log = a[1] / process_tree.IMAGES / f"{name}.log"
                    self.logs.mkdir(parents=True, exist_ok=True)
                    self.failed_logs += 1
                    with contextlib.suppress(OSError):
                        shutil.copy(log, self.logs / f"{name}-{self.failed_logs}.log")
                raise
            finally:
                self.current[name] = self.current.get(name, 0) + (time.perf_counter() - t) * 1000

        return wrapper

    def take(self) -> dict[str, float]:
        out, self.current = self.current, {}
        return out


def error_lines(log: Path) -> list[str]:
    with contextlib.suppress(OSError):
        return [ln.strip() for ln in log.read_text(errors="replace").splitlines() if "Error" in ln]
    return []


def anon(text: str) -> str:
    """CRIU's messages without pids and thread ids (its source lines and statuses kept)."""
    return re.sub(r"(?<![:=\d])\d{3,}\b", "N", text)


def disk_kib(path: Path) -> int:
    """Allocated size of a tree, not crossing mount points (du -x -s)."""
    if not path.exists():
        return 0
    dev, total = path.stat().st_dev, 0
    for root, dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
        dirs[:] = [d for d in dirs if os.lstat(os.path.join(root, d)).st_dev == dev]
    return total // 1024


def meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        k, v = line.split(":", 1)
        out[k] = int(v.split()[0])  # KiB
    return out


def host_used_mib() -> float:
    m = meminfo()
    return (m["MemTotal"] - m["MemAvailable"]) / 1024


def fs_fill(path: Path, extra_bytes: int = 0) -> float:
    """df's use% of the filesystem holding ``path`` once ``extra_bytes`` more are written."""
    s = os.statvfs(path)
    used = (s.f_blocks - s.f_bfree) * s.f_frsize + extra_bytes
    return used / (used + s.f_bavail * s.f_frsize - extra_bytes)


def memory(rt: Runtime, info: SandboxInfo) -> dict[str, float]:
    cg = rt.cgroup(info.id)
    u, pids = cg.usage(), cg.pids()
    return {"cgroup_mib": u["memory_bytes"] / MIB, "cgroup_rss_mib": u["memory_rss_bytes"] / MIB,
            "pss_mib": pss_kib(pids) / 1024, "processes": len(pids)}  # fmt: skip


def load() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


@contextlib.contextmanager
def throwaway_runtime(criu: str | None) -> Iterator[Runtime]:
    """A runtime on a fresh data dir; everything it made is killed and removed at the end."""
    data = Path(tempfile.mkdtemp(prefix="sandhold-sbench-", dir="/var/tmp"))
    data.chmod(0o755)  # the sandboxes' unprivileged owners must traverse it
    settings = Settings(data_dir=data, **({"criu_path": Path(criu)} if criu else {}))

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    old_term = signal.signal(signal.SIGTERM, interrupted)
    try:
        yield Runtime(settings).open()
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not stop the cleanup
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        t = time.monotonic()
        rt = Runtime(settings).open()  # (its reconcile also removes an interrupted create)

        def kill(sandbox_id: str) -> int:
            try:
                rt.kill(sandbox_id)
                return 0
            except Exception as e:
                print(f"cleanup: kill {sandbox_id} failed: {e}", file=sys.stderr)
                return 1

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            left = sum(pool.map(kill, [info.id for info in rt.list()]))
        cgroups.remove_parent(settings.cgroup_group)
        if cgroups.list_names(settings.cgroup_group):
            print(f"cleanup: cgroups left under {settings.cgroup_group}", file=sys.stderr)
        mounted = [ln for ln in Path("/proc/self/mountinfo").read_text().splitlines()
                   if f" {data}/" in ln]  # fmt: skip
        if left or mounted:
            print(f"cleanup: {len(mounted)} mounts left under {data}: kept", file=sys.stderr)
        else:
            shutil.rmtree(data, ignore_errors=True)
        print(f"cleanup: {time.monotonic() - t:.1f} s", file=sys.stderr)
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGINT, signal.default_int_handler)


async def first_answer(info: SandboxInfo, interpreter: bool, code: str = "1+1") -> str:
    """The first command (``/bin/true``) or ``run_code`` result of a sandbox."""
    if not interpreter:
        async with AgentClient(info.agent_socket, timeout=60) as c:
            r = await c.run(["/bin/true"])
            return f"exit {r.exit_code}"
    async with agent_channel(info.agent_socket, SERVICE_PORT, timeout=120) as ch:
        ex = await EnvdClient(ch).execute(code, language="python", timeout_s=120,
                                          max_output=1 << 20)  # fmt: skip
        if ex.error:
            raise RuntimeError(f"run_code({code!r}) failed: {ex.error}")
        return "".join(str(r.get("text", "")) for r in ex.results)


# What is measured: a bare sandbox; the same with one single-threaded process holding 64 MiB of
# random bytes (about what an idle interpreter sandbox holds, in a form CRIU can take here: a
# stand-in for how restore time grows with memory); an idle code interpreter (its kernel up, a
# variable set).
HOLD_64MIB = (
    '(python3 -c \'import os, time\nb = os.urandom(64 << 20)\nopen("/tmp/held", "w").write("y")\n'
    "time.sleep(10**9)' </dev/null >/dev/null 2>&1 &); "
    "for i in $(seq 500); do [ -s /tmp/held ] && break; sleep 0.02; done"
)
KINDS: dict[str, tuple[dict[str, Any], str | None]] = {
    "base": ({}, None),
    "base_holding_64mib": ({}, HOLD_64MIB),
    TEMPLATE_NAME: ({"template": TEMPLATE_NAME, "limits": {"memory_mb": 1024}}, None),
}


async def cycle(rt: Runtime, steps: Steps, kind: str, idle_s: float) -> dict[str, Any]:
    spec, setup = KINDS[kind]
    interpreter = kind == TEMPLATE_NAME
    info = rt.create(spec)
    out: dict[str, Any] = {}
    try:
        await first_answer(info, interpreter, "x = 41")  # (the kernel is up: state to keep)
        if setup:
            async with AgentClient(info.agent_socket, timeout=60) as c:
                await c.sh(setup)
        await asyncio.sleep(idle_s)
        out["memory_before"] = memory(rt, info)
        t = time.perf_counter()
        rt.pause(info.id)
        out["pause_ms"] = (time.perf_counter() - t) * 1000
        steps.take()  # suspended from paused, as the server's suspender does
        t = time.perf_counter()
        try:
            rt.suspend(info.id)
        except CheckpointFailed as e:
            out["suspend_failed_ms"] = (time.perf_counter() - t) * 1000
            out["suspend_error"] = anon(str(e))
            out["suspend_steps_ms"] = steps.take()
            got = rt.get(info.id)  # what the runtime promises: paused in the freezer, as it was
            back = {"state": got.state, "suspended": got.suspended,
                    "freezer": rt.cgroup(info.id).freezer_state()}  # fmt: skip
            rt.resume(info.id)
            out["after_failed_dump"] = back | {"answer": await first_answer(info, interpreter,
                                                                            "x + 1")}  # fmt: skip
            return out
        out["suspend_ms"] = (time.perf_counter() - t) * 1000
        out["suspend_steps_ms"] = steps.take()
        images = info.dir / process_tree.IMAGES
        out["image_kib"] = disk_kib(images)
        out["image_pages_kib"] = sum(p.stat().st_size for p in images.glob("pages-*.img")) // 1024
        out["memory_suspended"] = memory(rt, info)
        t = time.perf_counter()
        try:
            rt.resume(info.id)
        except CheckpointFailed as e:  # the runtime keeps it suspended, image and all
            out["resume_failed_ms"] = (time.perf_counter() - t) * 1000
            out["resume_error"] = anon(str(e))
            out["resume_failed_steps_ms"] = steps.take()
            return out
        t1 = time.perf_counter()
        answer = await first_answer(info, interpreter, "x + 1")
        t2 = time.perf_counter()
        if answer != ("42" if interpreter else "exit 0"):
            raise RuntimeError(f"after resume: {answer!r}")
        out["resume_ms"] = (t1 - t) * 1000
        out["resume_steps_ms"] = steps.take()
        out["after_resume_to_first_answer_ms"] = (t2 - t1) * 1000
        out["resume_to_first_answer_ms"] = (t2 - t) * 1000
        await asyncio.sleep(idle_s)
        out["memory_after_resume"] = memory(rt, info)
        return out
    finally:
        rt.kill(info.id)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def col(get: Callable[[dict[str, Any]], Any]) -> dict[str, float] | None:
        vals = [v for r in runs if (v := get(r)) is not None]
        return summary(vals) if vals else None

    ok = [r for r in runs if "resume_ms" in r]
    out: dict[str, Any] = {"cycles": len(runs), "suspended_and_resumed": len(ok)}
    for k in (
        "pause_ms",
        "suspend_ms",
        "resume_ms",
        "after_resume_to_first_answer_ms",
        "resume_to_first_answer_ms",
        "suspend_failed_ms",
        "image_kib",
        "image_pages_kib",
    ):
        out[k] = col(lambda r, k=k: r.get(k))  # type: ignore[misc]
    for phase in ("suspend_steps_ms", "resume_steps_ms"):
        out[phase] = {s: col(lambda r, p=phase, s=s: r.get(p, {}).get(s))  # type: ignore[misc]
                      for s in STEPS if any(s in r.get(phase, {}) for r in runs)}  # fmt: skip
    for when in ("memory_before", "memory_suspended", "memory_after_resume"):
        out[when] = {
            m: col(lambda r, w=when, m=m: r.get(w, {}).get(m))  # type: ignore[misc]
            for m in ("cgroup_mib", "cgroup_rss_mib", "pss_mib", "processes")
        }
    out["resume_failed_ms"] = col(lambda r: r.get("resume_failed_ms"))
    resume_errors = sorted({r["resume_error"] for r in runs if "resume_error" in r})
    if resume_errors:
        out["resume_errors"] = resume_errors
    errors = sorted({r["suspend_error"] for r in runs if "suspend_error" in r})
    if errors:
        out["suspend_errors"] = errors
        back = [r["after_failed_dump"] for r in runs if "after_failed_dump" in r]
        out["after_failed_dump"] = {
            "checked": len(back),
            "paused_in_the_freezer": sum(
                b["state"] == "paused" and not b["suspended"] and b["freezer"] == "FROZEN"
                for b in back
            ),
            "answered_with_its_state_after_resume": sum(
                b["answer"] in ("42", "exit 0") for b in back
            ),
        }
    return out


async def latency(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"mode": "latency", "n": args.n, "load_start": load(),
                              "suspended_from": "paused"}  # fmt: skip
    logs = Path(tempfile.mkdtemp(prefix="sandhold-sbench-logs-", dir="/var/tmp"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, logs, ignore_errors=True)
        rt = stack.enter_context(throwaway_runtime(args.criu))
        result["criu"] = criu_status(rt.settings.criu_path)[1]
        steps = Steps(logs)
        t = time.perf_counter()
        build_interpreter(rt.templates, cache_dir=Path(args.cache))
        result["interpreter_template_build_s"] = round(time.perf_counter() - t, 1)
        runs: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
        for i in range(args.n + 1):  # round 0 warms every path and is not counted
            order = list(runs)[i % len(runs) :] + list(runs)[: i % len(runs)]  # rotated
            for name in order:
                r = await cycle(rt, steps, name, args.idle)
                if i:
                    runs[name].append(r)
            print(f"round {i}/{args.n}", file=sys.stderr)
        result |= {name: summarize(rs) for name, rs in runs.items()}
        # The Error lines of every failed dump's or restore's log (CRIU logs errors only, -v2),
        # each distinct set once (their order varies between runs) with how often it came.
        seen: dict[tuple[str, frozenset[str]], dict[str, Any]] = {}
        for f in sorted(logs.glob("*.log")):
            errs = [anon(ln) for ln in error_lines(f)]
            log = f.name.split("-")[0]
            entry = seen.setdefault(
                (log, frozenset(errs)), {"log": log, "errors": errs, "count": 0}
            )
            entry["count"] += 1
        result["failed_criu_logs"] = list(seen.values())
    result["load_end"] = load()
    interp = result[TEMPLATE_NAME]
    p50 = (interp.get("resume_ms") or {}).get("p50")
    result["target_interpreter_resume_p50_le_300ms"] = None if p50 is None else p50 <= 300
    return result


async def in_parallel(fn: Callable[[int], Awaitable[None]], n: int, workers: int) -> None:
    """fn(0) .. fn(n - 1), ``workers`` at a time, in order of i."""
    it = iter(range(n))

    async def worker() -> None:
        for i in it:
            await fn(i)

    await asyncio.gather(*(worker() for _ in range(workers)))


async def density(args: argparse.Namespace) -> dict[str, Any]:
    live_n, susp_n = args.live, args.suspended
    data_fs = Path("/var/tmp")
    # Refuse before anything is made, on generous estimates (a suspended bare sandbox takes
    # ~10.5 MiB of disk, a live one ~11 MiB of memory).
    per_suspended = 5 if Settings().suspend_compress else 12  # MiB, base's 10.1 MiB image
    need = susp_n * per_suspended * MIB + live_n * 8 * MIB
    if fs_fill(data_fs, need) > args.max_disk_fill:
        raise SystemExit(f"refused: {need / 2**30:.1f} GiB more would fill {data_fs} past "
                         f"{args.max_disk_fill:.0%} (now {fs_fill(data_fs):.0%})")  # fmt: skip
    avail_mib = meminfo()["MemAvailable"] / 1024
    # ~11 MiB per live and ~0.3 MiB per suspended one were measured: refuse past 80 % of it.
    if live_n * 12 + susp_n * 0.35 > avail_mib * 0.8:
        raise SystemExit(f"refused: {live_n} live and {susp_n} suspended sandboxes need more "
                         f"than 80% of the {avail_mib:.0f} MiB available")  # fmt: skip
    spec = {"limits": {"memory_mb": args.memory_mb}}
    result: dict[str, Any] = {"mode": "density", "live_requested": live_n,
                              "suspended_requested": susp_n, "memory_mb_limit": args.memory_mb,
                              "load_start": load()}  # fmt: skip
    mounts0 = len(Path("/proc/self/mountinfo").read_text().splitlines())
    loops0 = len(list(Path("/sys/block").glob("loop*/loop/backing_file")))
    tasks0 = len(list(Path("/proc").glob("[0-9]*")))
    with throwaway_runtime(args.criu) as rt:
        result["criu"] = criu_status(rt.settings.criu_path)[1]
        rt.templates.get("base")
        rt.kill(rt.create(spec).id)  # warm the caches (agent lib, formatted image)
        s0 = os.statvfs(rt.settings.data_dir)
        await asyncio.sleep(args.settle)
        mem: dict[str, dict[str, int]] = {"baseline": meminfo()}
        live: list[SandboxInfo] = []
        t = time.perf_counter()

        async def one_live(_i: int) -> None:
            info = await asyncio.to_thread(rt.create, spec)
            async with AgentClient(info.agent_socket, timeout=60) as c:
                await c.run(["/bin/true"])  # fully started: what an idle sandbox holds
            live.append(info)

        await in_parallel(one_live, live_n, args.workers)
        result["live_create_all_s"] = round(time.perf_counter() - t, 1)
        await asyncio.sleep(args.settle)
        mem["live"] = meminfo()
        creates: list[float] = []
        suspends: list[float] = []
        suspended: list[SandboxInfo] = []
        stopped: str | None = None
        t = time.perf_counter()

        async def one_suspended(i: int) -> None:
            nonlocal stopped
            if i % 25 == 0 and fs_fill(rt.settings.data_dir) > args.max_disk_fill:
                stopped = f"after {i}: {rt.settings.data_dir} past {args.max_disk_fill:.0%}"
            if not stopped and time.perf_counter() - t > args.deadline_min * 60:
                stopped = f"after {i}: --deadline-min {args.deadline_min:g} reached"
            if stopped:
                return
            t0 = time.perf_counter()
            try:
                info = await asyncio.to_thread(rt.create, spec)
                async with AgentClient(info.agent_socket, timeout=60) as c:
                    await c.run(["/bin/true"])
                t1 = time.perf_counter()
                # then suspended from paused, as by the server's suspender
                await asyncio.to_thread(rt.pause, info.id)
                t2 = time.perf_counter()
                await asyncio.to_thread(rt.suspend, info.id)
            except Exception as e:  # report where the host stops, not a traceback
                stopped = stopped or f"after {i}: {type(e).__name__}: {e}"
                return
            creates.append((t1 - t0) * 1000)
            suspends.append((time.perf_counter() - t2) * 1000)
            suspended.append(info)
            if len(suspended) % 500 == 0:
                print(f"suspended {len(suspended)}/{susp_n} at {time.perf_counter() - t:.0f} s, "
                      f"load {load()[0]}", file=sys.stderr)  # fmt: skip

        await in_parallel(one_suspended, susp_n, args.workers)
        result["suspended_create_and_suspend_all_s"] = round(time.perf_counter() - t, 1)
        await asyncio.sleep(args.settle)
        mem["suspended"] = meminfo()
        s1 = os.statvfs(rt.settings.data_dir)
        result["stopped"] = stopped
        result["live"] = len(live)
        result["suspended"] = len(suspended)
        healthy = 0
        for info in live:
            async with AgentClient(info.agent_socket, timeout=30) as c:
                healthy += await c.health()
        result["live_healthy"] = healthy
        pss = [pss_kib(rt.cgroup(i.id).pids()) / 1024 for i in live[:50]]
        result["live_pss_mib"] = summary(pss)
        susp_cg = [rt.cgroup(i.id).usage() for i in suspended]
        result["suspended_processes"] = sum(u["pids"] for u in susp_cg)
        result["suspended_cgroup_memory_mib"] = summary([u["memory_bytes"] / MIB for u in susp_cg])
        result["suspended_cgroup_rss_mib"] = summary([u["memory_rss_bytes"] / MIB for u in susp_cg])
        result["suspended_disk_kib"] = summary([disk_kib(i.dir) for i in suspended])
        result["suspended_image_kib"] = summary(
            [disk_kib(i.dir / process_tree.IMAGES) for i in suspended]
        )
        result["data_fs_used_delta_mib"] = round(((s0.f_bfree - s1.f_bfree) * s0.f_frsize) / MIB, 1)
        result["host_mounts_added"] = (
            len(Path("/proc/self/mountinfo").read_text().splitlines()) - mounts0
        )
        result["loop_devices_added"] = (
            len(list(Path("/sys/block").glob("loop*/loop/backing_file"))) - loops0
        )
        result["host_tasks_added"] = len(list(Path("/proc").glob("[0-9]*"))) - tasks0
        result["create_to_first_command_ms"] = summary(creates) if creates else None
        result["suspend_ms"] = summary(suspends) if suspends else None
        result["suspend_ms_per_100"] = [summary(suspends[k : k + 100])["p50"]
                                        for k in range(0, len(suspends), 100)]  # fmt: skip
        # Host memory: /proc/meminfo deltas, in MiB, total and per sandbox.
        keys = ("MemAvailable", "Cached", "Slab", "SUnreclaim", "KernelStack", "PageTables")
        used = {k: (v["MemTotal"] - v["MemAvailable"]) / 1024 for k, v in mem.items()}
        result["host_used_mib"] = {k: round(v, 1) for k, v in used.items()}
        result["meminfo_delta_mib"] = {
            step: {k: round((mem[step][k] - mem[prev][k]) / 1024, 1) for k in keys}
            for step, prev in (("live", "baseline"), ("suspended", "live"))
        }
        result["host_used_per_live_mib"] = round(
            (used["live"] - used["baseline"]) / max(1, len(live)), 2
        )
        result["host_used_per_suspended_mib"] = round(
            (used["suspended"] - used["live"]) / max(1, len(suspended)), 3
        )
        # A sample resumed: they are real sandboxes, and resume still works at this density.
        resumes, ok = [], 0
        for info in suspended[:: max(1, len(suspended) // args.resume_sample)][
            : args.resume_sample
        ]:
            t = time.perf_counter()
            rt.resume(info.id)
            resumes.append((time.perf_counter() - t) * 1000)
            ok += (await first_answer(info, False)) == "exit 0"
        result["resume_sample"] = {
            "resumed_ok": ok,
            "resume_ms": summary(resumes) if resumes else None,
        }
        t = time.perf_counter()
    result["cleanup_s"] = round(time.perf_counter() - t, 1)
    await asyncio.sleep(args.settle)
    result["host_used_mib"]["after_cleanup"] = round(host_used_mib(), 1)  # (others' drift)
    result["load_end"] = load()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("latency", "density"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--criu", default=None, help="CRIU binary (default: settings.criu_path)")
    ap.add_argument("--n", type=int, default=20, help="latency: cycles of each template")
    ap.add_argument(
        "--idle", type=float, default=2.0, help="latency: idle seconds before measuring"
    )
    ap.add_argument("--cache", default="/var/tmp/sandhold-cache/interpreter")
    ap.add_argument("--live", type=int, default=200, help="density: live idle sandboxes")
    ap.add_argument("--suspended", type=int, default=1000, help="density: suspended sandboxes")
    ap.add_argument("--memory-mb", type=int, default=64, help="density: each sandbox's limit")
    ap.add_argument("--max-disk-fill", type=float, default=0.80)
    ap.add_argument("--settle", type=float, default=5.0, help="density: seconds before meminfo")
    ap.add_argument("--resume-sample", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2, help="density: creates/suspends at once")
    ap.add_argument("--deadline-min", type=float, default=float("inf"),
                    help="density: stop suspending more after this long, and report")  # fmt: skip
    args = ap.parse_args()
    ok, detail = criu_status(Path(args.criu) if args.criu else Settings().criu_path)
    if not ok:
        raise SystemExit(f"CRIU unusable: {detail}")
    result = {"host": {"kernel": platform.release(), "cpus": os.cpu_count(),
                       "mem_total_mib": meminfo()["MemTotal"] // 1024}}  # fmt: skip
    run = latency if args.mode == "latency" else density
    result |= asyncio.run(run(args))
    default = "suspend" if args.mode == "latency" else "density"
    write_result(args.out or f"bench/results/{default}.json", result)


if __name__ == "__main__":
    main()
