"""Template builds (issue 14): cold build, cached rebuild and last-step rebuild of a template built
FROM base through the official SDK's ``Template`` builder; the layer disk shared by two templates
that differ only in their last step; create latency of a sandbox of the built template vs ``base``.

    .venv/bin/python bench/template_bench.py [--n 3] [--creates 10] [--steps auto|pip|offline] \\
        [--out bench/results/templates.json]

Each round starts its own ``sandhold serve`` (tests/support/e2b_server.py) on a fresh data dir under
/var/tmp with the default ``template_build_allow_out``: pip in a build step reaches this machine's
configured index through the egress proxy. Steps ``pip``: ``pip_install`` of three small
pure-Python packages the base (the host's /usr) lacks, then a ``run_cmd`` importing them. If pip's
cold build fails (``auto``), its log is kept in the result and the rounds use ``offline`` steps
instead: COPY of a 5 MiB context file, then a RUN writing files. Times are milliseconds: the
whole ``Template.build`` call (the SDK polls its status every 0.2 s).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ["NO_PROXY"] = "127.0.0.1,localhost"  # the server is on loopback

from e2b import Sandbox, Template
from e2b.exceptions import BuildException
from tests.support.e2b_server import KEY_A, Server, new_server

from benchstats import summary, write_result

PACKAGES = ["idna", "tabulate", "termcolor"]  # (six is in the host's /usr already)
STEP = re.compile(r"^(CACHED )?\[\d+/\d+\] ")


def template(steps: str, last: int, context: Path) -> Template:
    """The bench's template; ``last`` changes only its last step."""
    if steps == "pip":
        # g=False: as root (the default, g=True) pip finds the host's /usr read-only and falls
        # back to /root/.local, which the default user's run_cmd does not see.
        tpl = Template().from_base_image().pip_install(PACKAGES, g=False)
        return tpl.run_cmd(f"python3 -c 'import {', '.join(PACKAGES)}; print({last})'")
    blob = context / "blob.bin"
    if not blob.exists():
        blob.write_bytes(os.urandom(5 << 20))
    tpl = Template(file_context_path=str(context)).from_base_image()
    tpl = tpl.copy("blob.bin", "/home/user/blob.bin")
    return tpl.run_cmd(f"mkdir -p out && for i in $(seq 100); do echo {last} $i > out/$i; done")


def build(tpl: Template, name: str, kw: dict[str, str]) -> dict[str, object]:
    logs: list[str] = []
    t = time.perf_counter()
    info = Template.build(tpl, name, on_build_logs=lambda e: logs.append(e.message), **kw)
    ms = (time.perf_counter() - t) * 1000
    steps = [line for line in logs if STEP.match(line)]
    return {
        "ms": ms, "store_name": f"{info.template_id}.{info.build_id[:8]}", "steps": len(steps),
        "cached": sum(line.startswith("CACHED") for line in steps),
        "step_s": [float(m[1]) for line in logs if (m := re.match(r"done in ([\d.]+) s$", line))],
    }  # fmt: skip


def du(dirs: list[Path]) -> dict[str, int]:
    """Bytes on disk under ``dirs`` (hard links once), files, and of them under a ``.cache``."""
    seen: set[tuple[int, int]] = set()
    out = {"bytes": 0, "files": 0, "cache_bytes": 0}
    for top in dirs:
        for root, _dirs, files in os.walk(top):  # (symlinks not followed)
            for p in [Path(root), *(Path(root) / n for n in files)]:
                st = p.lstat()
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
                out["bytes"] += st.st_blocks * 512
                out["files"] += p.name in files
                if ".cache" in p.relative_to(top).parts:
                    out["cache_bytes"] += st.st_blocks * 512
    return out


def layers_of(srv: Server, store_name: str) -> list[Path]:
    meta = json.loads((srv.data_dir / "templates" / store_name / "template.json").read_text())
    return [Path(p) for p in meta["layers"]]


def first_command(template_name: str, kw: dict[str, str], live: list[Sandbox]) -> dict:
    t = time.perf_counter()
    sbx = Sandbox.create(template_name, **kw)
    live.append(sbx)
    created = time.perf_counter()
    sbx.commands.run("true")
    done = time.perf_counter()
    sbx.kill()
    live.remove(sbx)
    return {"create_ms": (created - t) * 1000, "first_cmd_ms": (done - t) * 1000}


def one_round(steps: str, creates: int, context: Path) -> dict[str, object]:
    tmp = Path(tempfile.mkdtemp(prefix="sandhold-tbench-", dir="/var/tmp"))
    srv = new_server(tmp)
    live: list[Sandbox] = []
    ok = False
    try:
        srv.start()
        kw = {"api_url": srv.url, "sandbox_url": srv.url, "api_key": KEY_A}
        # base is made on its first use: once here, so the cold build below is the steps' alone.
        base_first = first_command("base", kw, live)
        b = {
            "cold": build(template(steps, 0, context), "bench-a", kw),
            "cached": build(template(steps, 0, context), "bench-a", kw),
            "last_step_changed": build(template(steps, 1, context), "bench-b", kw),
        }
        n = b["cold"]["steps"]
        want = {"cold": 0, "cached": n, "last_step_changed": n - 1}
        for k, cached in want.items():
            if b[k]["cached"] != cached or b[k]["steps"] != n:
                raise RuntimeError(f"{k}: {b[k]['cached']} of {b[k]['steps']} steps CACHED")
        la, lb = (layers_of(srv, b[k]["store_name"]) for k in ("cached", "last_step_changed"))
        da, db, union = du(la), du(lb), du(sorted(set(la) | set(lb)))
        disk = {"template_a": da, "template_b": db, "union": union,
                "shared_bytes": da["bytes"] + db["bytes"] - union["bytes"],
                "layers": {"a": len(la), "b": len(lb), "shared": len(set(la) & set(lb))},
                "per_layer_bytes_a": [du([p])["bytes"] for p in la]}  # fmt: skip
        built = b["cached"]["store_name"]
        if steps == "pip":  # the built template works
            sbx = Sandbox.create(built, **kw)
            live.append(sbx)
            sbx.commands.run(f"python3 -c 'import {', '.join(PACKAGES)}'")
            sbx.kill()
            live.remove(sbx)
        creates_of: dict[str, list[dict]] = {"built": [], "base": []}
        for i in range(creates):  # interleaved, the order alternating
            for which in ["built", "base"] if i % 2 == 0 else ["base", "built"]:
                creates_of[which].append(
                    first_command(built if which == "built" else "base", kw, live)
                )
        ok = True
        return {"base_first_use": base_first, "builds": b, "disk": disk, "creates": creates_of}
    finally:
        for sbx in live:
            with contextlib.suppress(Exception):
                sbx.kill()
        try:
            srv.destroy()
        finally:
            if not ok and srv.log.exists():
                print(srv.log.read_text()[-3000:], file=sys.stderr)
            shutil.rmtree(tmp, ignore_errors=True)


def pip_failure(context: Path) -> list[str] | None:
    """None if pip's build works on this machine; else its build log."""
    tmp = Path(tempfile.mkdtemp(prefix="sandhold-tbench-", dir="/var/tmp"))
    srv = new_server(tmp)
    logs: list[str] = []
    try:
        srv.start()
        kw = {"api_url": srv.url, "sandbox_url": srv.url, "api_key": KEY_A}
        try:
            Template.build(template("pip", 0, context), "bench-probe",
                           on_build_logs=lambda e: logs.append(e.message), **kw)  # fmt: skip
        except BuildException as e:
            return [*logs, f"BuildException: {e}"]
        return None
    finally:
        srv.destroy()
        shutil.rmtree(tmp, ignore_errors=True)


def sh(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True).stdout.strip()


def main(args: argparse.Namespace) -> dict[str, object]:
    load_before = sh("uptime")
    context = Path(tempfile.mkdtemp(prefix="sandhold-tbench-ctx-", dir="/var/tmp"))
    try:
        steps, failure = args.steps, None
        if steps == "auto":
            failure = pip_failure(context)
            steps = "pip" if failure is None else "offline"
        rounds = [one_round(steps, args.creates, context) for _ in range(args.n)]
    finally:
        shutil.rmtree(context, ignore_errors=True)
    builds = {k: summary([r["builds"][k]["ms"] for r in rounds]) for k in rounds[0]["builds"]}
    step_s = {k: [r["builds"][k]["step_s"] for r in rounds] for k in rounds[0]["builds"]}
    creates = {
        w: {m: summary([c[m] for r in rounds for c in r["creates"][w]]) for m in c0}
        for w, c0 in ((w, rounds[0]["creates"][w][0]) for w in ("built", "base"))
    }
    return {
        "commit": sh("git", "rev-parse", "--short", "HEAD"),
        "src_modified_vs_commit": sh("git", "status", "--porcelain", "--", "src").splitlines(),
        "host": {"cpus": os.cpu_count(), "kernel": platform.release()},
        "load_before": load_before,
        "load_after": sh("uptime"),
        "steps": steps,
        "packages": PACKAGES if steps == "pip" else None,
        "pip_failure_log": failure,
        "rounds": args.n,
        "build_ms": builds,
        "build_steps": {k: rounds[0]["builds"][k]["steps"] for k in builds},
        "build_steps_cached": {k: rounds[0]["builds"][k]["cached"] for k in builds},
        "build_step_done_s": step_s,
        "layer_disk": [r["disk"] for r in rounds],
        "create": creates,
        "base_first_use_ms": summary([r["base_first_use"]["first_cmd_ms"] for r in rounds]),
    }


def interrupted(_sig: int, _frame: object) -> None:
    raise KeyboardInterrupt  # (SIGTERM cleans up as Ctrl-C does)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=3, help="rounds, each on a fresh data dir")
    parser.add_argument("--creates", type=int, default=10, help="sandboxes of each per round")
    parser.add_argument("--steps", choices=["auto", "pip", "offline"], default="auto")
    parser.add_argument("--out", default="bench/results/templates.json")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, interrupted)
    write_result(args.out, main(args))
