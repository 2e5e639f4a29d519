"""Code-interpreter benchmarks: template build, fresh sandbox to first ``run_code`` result, warm
``1+1`` round trip, and memory (PSS) of an idle interpreter sandbox.

    .venv/bin/python bench/interpreter_bench.py [--n 10] [--iterations 200] \\
        [--cache /var/tmp/sandhold-cache/interpreter] [--out bench/results/interpreter.json]

Prints one JSON document (and writes it to --out). Times are milliseconds.

``--baseline REV`` adds ``hops``: in one more (cold) sandbox, the interpreter service of git
revision REV runs next to the template's own (port 49998, the same packages), and a client
inside the sandbox alternates between the two, in blocks of 25 calls back to back:
``POST /execute 1+1``, a bare execute on the service's kernel (jupyter_client's Session over
ZMQ, to the reply and to the IOPub idle status: the kernel's own share) and ``GET /health``
(the HTTP floor). Before and after in one run.

Three ways a sandbox starts are timed, interleaved in one run: ``cold`` (booted: agent, service,
kernel start), ``warm`` (restored from the template's checkpoint, checkpoint/warm.py; made first,
its build time and size reported) and ``pool`` (booted ahead, runtime/pool.py, and taken by the
create). Without CRIU ``warm`` does not run.

It drives the runtime directly, the way the agent will once its ``services`` start the
interpreter at boot: create the sandbox, start the service with the template's own argv/env
(one agent exec, as the agent would), and time, from inside the sandbox, the first answer of
``POST /execute {"code": "1+1"}``. So "first result" = sandbox create + service start + kernel
start + one execution, without the host HTTP proxy (measured by bench/e2b_bench.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

from benchstats import destroy_data_dir, pss_kib, summary, write_result
from sandhold.config import Settings
from sandhold.interpreter.template import (
    SANDBOX_CODE,
    SANDBOX_HOME,
    SERVICE,
    SERVICE_PORT,
    TEMPLATE_NAME,
    build_code_interpreter_template,
)
from sandhold.runtime import cgroups
from sandhold.runtime.checkpoint.criu import criu_status
from sandhold.runtime.client import AgentClient
from sandhold.runtime.runtime import Runtime

# Runs inside the sandbox: wait for the service, then time executions over one keep-alive
# connection. Prints JSON: the wall-clock time of the first result and the round trips.
CLIENT = r"""
import http.client, json, sys, time
port, iterations = int(sys.argv[1]), int(sys.argv[2])
body = json.dumps({"code": "1+1", "context_id": None, "language": None, "env_vars": None})

def execute(conn):
    conn.request("POST", "/execute", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    text = r.read().decode()
    assert r.status == 200 and '"text": "2"' in text, text
    return text

while True:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        execute(conn)
        break
    except (ConnectionRefusedError, OSError):
        time.sleep(0.01)
first = time.time()
rtts = []
for _ in range(iterations):
    t = time.perf_counter()
    execute(conn)
    rtts.append((time.perf_counter() - t) * 1000)
print(json.dumps({"first_result_at": first, "rtt_ms": rtts}))
"""


# Runs inside the sandbox (as root, which owns the kernels' connection files): alternates blocks
# of HTTP executions and bare kernel executions over the services on the given ports.
HOPS_CLIENT = r"""
import glob, http.client, json, sys, time
import zmq
from jupyter_client.session import Session
iterations, block = int(sys.argv[1]), 25
services = json.loads(sys.argv[2])  # name -> [port, directory of its kernel's runtime dir]
body = json.dumps({"code": "1+1", "context_id": None, "language": None, "env_vars": None})

def execute(conn):
    conn.request("POST", "/execute", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    text = r.read().decode()
    assert r.status == 200 and '"text": "2"' in text, text

def health(conn):
    conn.request("GET", "/health")
    conn.getresponse().read()

class Bare:
    def __init__(self, tmp):
        info = json.load(open(glob.glob(tmp + "/sandhold-kernel-*/kernel.json")[0]))
        self.session = Session(key=info["key"].encode(), signature_scheme=info["signature_scheme"])
        addr = lambda ch: f"{info['transport']}://{info['ip']}-{info[ch + '_port']}"
        self.shell = zmq.Context.instance().socket(zmq.DEALER)
        self.shell.connect(addr("shell"))
        self.iopub = zmq.Context.instance().socket(zmq.SUB)
        self.iopub.setsockopt(zmq.SUBSCRIBE, b"")
        self.iopub.connect(addr("iopub"))
        self.poller = zmq.Poller()
        self.poller.register(self.shell, zmq.POLLIN)
        self.poller.register(self.iopub, zmq.POLLIN)

    def execute(self):
        t0 = time.perf_counter()
        content = {"code": "1+1", "silent": False, "store_history": True, "user_expressions": {},
                   "allow_stdin": False, "stop_on_error": False}
        msg_id = self.session.send(self.shell, "execute_request", content)["header"]["msg_id"]
        reply = idle = None
        while reply is None or idle is None:
            ready = dict(self.poller.poll(10000))
            assert ready, "the kernel did not answer"
            for sock in ready:
                m = self.session.recv(sock)[1]
                if m["parent_header"].get("msg_id") != msg_id:
                    continue
                if sock is self.shell:
                    reply = (time.perf_counter() - t0) * 1000
                elif m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
                    idle = (time.perf_counter() - t0) * 1000
        return reply, idle

conns, bares = {}, {}
for name, (port, tmp) in services.items():
    while True:
        try:
            conns[name] = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            execute(conns[name])
            break
        except (ConnectionRefusedError, OSError):
            time.sleep(0.05)
    bares[name] = Bare(tmp)
time.sleep(0.3)  # the SUB sockets' subscriptions reach the kernels
kinds = ("http_execute", "bare_reply", "bare_idle", "health")
out = {f"{n}_{k}": [] for n in services for k in kinds}
names = list(services)
for _ in range(50):
    for n in names:
        execute(conns[n]); bares[n].execute()
for i in range(iterations // block):
    for n in (names if i % 2 == 0 else names[::-1]):
        for _ in range(block):  # each kind back to back, as a client calls
            t = time.perf_counter(); execute(conns[n])
            out[n + "_http_execute"].append((time.perf_counter() - t) * 1000)
        for _ in range(block):
            t = time.perf_counter(); health(conns[n])
            out[n + "_health"].append((time.perf_counter() - t) * 1000)
        for _ in range(block):
            reply, idle = bares[n].execute()
            out[n + "_bare_reply"].append(reply); out[n + "_bare_idle"].append(idle)
print(json.dumps(out))
"""
BASELINE_PORT = 49998


def baseline_files(rev: str) -> dict[str, bytes]:
    """The interpreter package of git revision ``rev``: path below the package -> content."""
    root = Path(__file__).resolve().parents[1]
    listing = subprocess.run(
        ["git", "-C", str(root), "ls-tree", "--name-only", rev, "src/sandhold/interpreter/"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    return {
        Path(f).name: subprocess.run(
            ["git", "-C", str(root), "show", f"{rev}:{f}"], capture_output=True, check=True
        ).stdout
        for f in listing
        if Path(f).suffix in (".py", ".js", ".java")
    }


async def hops(rt: Runtime, rev: str, iterations: int) -> dict[str, object]:
    """Where a warm 1+1 goes, this tree against ``rev``, alternated in one sandbox."""
    info = rt.create({"template": TEMPLATE_NAME, "limits": {"memory_mb": 1024}})
    try:
        async with AgentClient(info.agent_socket, timeout=300) as agent:
            base = "/tmp/sandhold-baseline"
            await agent.write_file(f"{base}/code/sandhold/__init__.py", b"")
            for name, data in baseline_files(rev).items():
                await agent.write_file(f"{base}/code/sandhold/interpreter/{name}", data)
            env = {str(k): str(v) for k, v in SERVICE["env"].items()}  # type: ignore[attr-defined]
            env["PYTHONPATH"] = env["PYTHONPATH"].replace(SANDBOX_CODE, f"{base}/code")
            env["TMPDIR"] = f"{base}/tmp"  # where its kernel's connection file goes
            argv = [str(a) for a in SERVICE["argv"]]  # type: ignore[attr-defined]
            argv[argv.index(str(SERVICE_PORT))] = str(BASELINE_PORT)
            await agent.sh(f"mkdir -p {base}/tmp")
            await agent.run(argv, user="root", cwd=SANDBOX_HOME, env=env, background=True)
            services = {"now": [SERVICE_PORT, "/tmp"], "baseline": [BASELINE_PORT, f"{base}/tmp"]}
            r = await agent.run(
                ["/usr/bin/python3", "-c", HOPS_CLIENT, str(iterations), json.dumps(services)],
                user="root",
            )
            if r.exit_code != 0:
                raise RuntimeError(f"hops client failed: {r.stderr.decode()[-2000:]}")
            raw: dict[str, list[float]] = json.loads(r.stdout)
    finally:
        rt.kill(info.id)
    out: dict[str, object] = {"baseline_rev": rev, "block": 25}
    out.update({k: summary(v) for k, v in raw.items()})
    out["ratio_p50"] = {
        k: round(float(out[f"now_{k}"]["p50"]) / float(out[f"baseline_{k}"]["p50"]), 3)  # type: ignore[index]
        for k in ("http_execute", "bare_reply", "bare_idle", "health")
    }
    return out


async def one_sandbox(rt: Runtime, iterations: int, mode: str) -> dict[str, object]:
    t0 = time.time()
    info = rt.create({"template": TEMPLATE_NAME, "limits": {"memory_mb": 1024}})
    created = time.time()
    if info.started_from != (mode if mode in ("warm", "pool") else None):
        raise RuntimeError(f"a {mode} round started {info.started_from or 'cold'}")
    try:
        async with AgentClient(info.agent_socket, timeout=300) as agent:
            r = await agent.run(
                ["/usr/bin/python3", "-c", CLIENT, str(SERVICE_PORT), str(iterations)],
                user="user",
            )
            if r.exit_code != 0:
                raise RuntimeError(f"client failed: {r.stderr.decode()[-2000:]}")
            out = json.loads(r.stdout)
            await asyncio.sleep(2.0)  # let the interpreter go idle before measuring memory
            pids = cgroups.group(info.id, rt.settings.cgroup_group).pids()
            return {
                "create_ms": (created - t0) * 1000,
                "first_result_ms": (out["first_result_at"] - t0) * 1000,
                "rtt_ms": out["rtt_ms"],
                "pss_kib": pss_kib(pids),
                "processes": len(pids),
                "cgroup_memory_bytes": rt.usage(info.id).memory_bytes,
            }
    finally:
        rt.kill(info.id)


async def main(args: argparse.Namespace) -> dict[str, object]:
    data_dir = Path(tempfile.mkdtemp(prefix="sandhold-ibench-", dir="/var/tmp"))
    data_dir.chmod(0o755)
    settings = Settings(data_dir=data_dir)
    try:
        rt = Runtime(settings).open()
        t = time.perf_counter()
        build_code_interpreter_template(rt.templates, cache_dir=Path(args.cache))
        build_ms = (time.perf_counter() - t) * 1000
        modes = {"cold": Runtime(settings.model_copy(update={"warm_templates": False})).open()}
        warm: dict[str, object] = {"available": False}
        if criu_status(settings.criu_path)[0]:
            t = time.perf_counter()
            checkpoint = rt.warm.build(TEMPLATE_NAME)
            warm = {"available": True, "build_ms": round((time.perf_counter() - t) * 1000, 1),
                    "size_mib": round(du(checkpoint) / 2**20, 1)}  # fmt: skip
            modes["warm"] = rt
        # Booted ahead (runtime/pool.py), itself started warm where it can: refilled, untimed,
        # before each of its rounds.
        modes["pool"] = Runtime(settings.model_copy(update={"pool_sizes": {TEMPLATE_NAME: 1}}))
        modes["pool"].open()
        runs: dict[str, list[dict[str, object]]] = {m: [] for m in modes}
        if args.baseline:
            hop_runtime = modes["cold"]
        for i in range(args.n):  # interleaved: the host's load falls on both alike
            for mode, r in modes.items():
                if mode == "pool":
                    r.pools.fill(TEMPLATE_NAME)
                    await asyncio.sleep(1.0)  # the boot's own work settles first
                runs[mode].append(await one_sandbox(r, args.iterations if i == 0 else 0, mode))
        out: dict[str, object] = {
            "host": {"cpus": os.cpu_count(), "kernel": platform.release()},
            "template_build_ms": round(build_ms, 1),
            "template_build_note": "with the wheel/site cache in --cache already filled",
            "warm_checkpoint": warm,
        }
        if args.baseline:
            out["hops"] = await hops(hop_runtime, args.baseline, args.hop_iterations)
        for mode, rs in runs.items():
            if not rs:  # --n 0: the hops only
                continue
            out[mode] = {
                "sandbox_create_ms": summary([r["create_ms"] for r in rs]),  # type: ignore[misc]
                "fresh_sandbox_to_first_result_ms": summary(
                    [r["first_result_ms"] for r in rs]  # type: ignore[misc]
                ),
                "warm_run_code_1plus1_rtt_ms": summary(rs[0]["rtt_ms"]),  # type: ignore[arg-type]
                "idle_sandbox_pss_mib": summary([r["pss_kib"] / 1024 for r in rs]),  # type: ignore[operator]
                "idle_sandbox_processes": rs[0]["processes"],
                "idle_sandbox_cgroup_memory_mib": summary(
                    [r["cgroup_memory_bytes"] / 2**20 for r in rs]  # type: ignore[operator]
                ),
            }
        return out
    finally:
        destroy_data_dir(data_dir)


def du(path: Path) -> int:
    """Bytes on disk under ``path`` (hard links once)."""
    seen, total = set(), 0
    for f in path.rglob("*"):
        st = f.lstat()
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10, help="fresh sandboxes to time")
    parser.add_argument("--iterations", type=int, default=200, help="warm 1+1 round trips")
    parser.add_argument("--baseline", help="git revision to time the warm 1+1 hops against")
    parser.add_argument("--hop-iterations", type=int, default=1000)
    parser.add_argument("--cache", default="/var/tmp/sandhold-cache/interpreter")
    parser.add_argument("--out", default="bench/results/interpreter.json")
    args = parser.parse_args()
    result = asyncio.run(main(args))
    write_result(args.out, result)
