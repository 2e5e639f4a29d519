"""Soak: create -> run -> kill cycles through the official, unmodified e2b SDK (4 client threads)
against a real `sandhold serve`, with a `kill -9` of the server every 1,000 cycles while a create
is in flight (a sandbox directory without its record yet); then what leaked.

    .venv/bin/python bench/soak_bench.py [--cycles 10000] [--clients 4] [--kill-every 1000]
                                         [--out bench/results/soak.json]

The server is restarted on the same listening socket (held here, handed over with --fd), so
requests sent while it is down wait in the backlog. A cycle cut by the crash counts as
interrupted; a sandbox whose create succeeded but whose answer died with the server is still
listed afterwards and is killed through the API at the end (`lost_but_listed`).

Leaks, target 0 each, counted after that: mounts under the data dir, cgroups of its parent
group (every hierarchy), live processes of its sandboxes (in their cgroups, or naming their
directory or groups on their command line), loop devices backed by its files, entries under
``sandboxes/``; and the growth of the server's open fds (less the clients' keep-alive
connections) between two idle moments of each server's life (after its first cycles, and before
it is killed or stopped).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from e2b import Sandbox
from e2b.api.metadata import package_version

from benchstats import summary, write_result
from sandhold.config import Settings
from sandhold.runtime import cgroups, mounts
from sandhold.runtime.runtime import Runtime

API_KEY = "soak-key"
WARM_CYCLES = 20  # of each server's life, before its fds are counted


class Server:
    """`sandhold serve` on a socket this process holds, so it can be SIGKILLed and restarted
    on the same port."""

    def __init__(self, data_dir: Path, log: Path) -> None:
        self.data_dir = data_dir
        self.log = log
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(2048)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_")}
        env.update(SANDHOLD_DATA_DIR=str(self.data_dir), SANDHOLD_PREBUILD_TEMPLATES="[]",
                   SANDHOLD_API_KEYS=json.dumps({API_KEY: "soak"}))  # fmt: skip
        fd = self.sock.fileno()
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sandhold.cli", "serve", "--fd", str(fd)], env=env,
                stdout=out, stderr=subprocess.STDOUT, pass_fds=(fd,),
            )  # fmt: skip
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError("server did not start")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)

    def fds(self) -> int:
        """Open fds of the server, less its connections from clients (keep-alive connections
        come and go with the SDK's pools; they are the clients' to close)."""
        assert self.proc is not None
        port = self.sock.getsockname()[1]
        conns = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with contextlib.suppress(FileNotFoundError), open(table) as f:
                for line in f.readlines()[1:]:
                    col = line.split()
                    if int(col[1].rsplit(":", 1)[1], 16) == port and col[3] == "01":
                        conns.add(f"socket:[{col[9]}]")  # ESTABLISHED, to our port
        d = f"/proc/{self.proc.pid}/fd"
        links = []
        for fd in os.listdir(d):
            with contextlib.suppress(OSError):
                links.append(os.readlink(f"{d}/{fd}"))
        return sum(1 for link in links if link not in conns)

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"X-API-KEY": API_KEY}, timeout=60)


class Clients:
    """Client threads running cycles; the controller can hold them between cycles."""

    def __init__(self, n: int, cycles: int) -> None:
        self.cycles = cycles
        self.lock = threading.Lock()
        self.started = 0  # cycles handed out
        self.done = 0  # cycles finished (ok or interrupted)
        self.ok = 0
        self.errors: dict[str, int] = {}
        self.cycle_ms: list[float] = []
        self.busy = 0
        self.gate = threading.Event()
        self.gate.set()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(n)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _take(self) -> bool:
        self.gate.wait()
        with self.lock:
            if self.started >= self.cycles:
                return False
            self.started += 1
            self.busy += 1
            return True

    def _run(self) -> None:
        while self._take():
            t = time.perf_counter()
            try:
                sbx = Sandbox.create(timeout=120)
                out = sbx.commands.run("echo ok").stdout.strip()
                sbx.kill()
                error = None if out == "ok" else f"wrong output {out!r}"
            except Exception as e:  # the server died under the request: interrupted
                error = type(e).__name__
            with self.lock:
                self.done += 1
                self.busy -= 1
                if error is None:
                    self.ok += 1
                    self.cycle_ms.append((time.perf_counter() - t) * 1000)
                else:
                    self.errors[error] = self.errors.get(error, 0) + 1
            if error is not None:
                time.sleep(0.1)

    def hold(self) -> None:
        """Return once no cycle is running and none will start until ``release``."""
        self.gate.clear()
        while True:
            with self.lock:
                if self.busy == 0:
                    return
            time.sleep(0.005)

    def release(self) -> None:
        self.gate.set()

    def join(self) -> None:
        for t in self.threads:
            t.join()


def creating(data_dir: Path, within: float = 10.0) -> bool:
    """Wait (bounded) until a create is in flight: a sandbox directory without its record yet;
    then a random moment more, so the crash falls anywhere in the create."""
    sdir = data_dir / "sandboxes"
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for d in sdir.iterdir():
            if not (d / "state.json").exists() and not (d / "killing.json").exists():
                time.sleep(random.uniform(0, 0.03))
                return True
        time.sleep(0.001)
    return False


def leaks(data_dir: Path) -> dict[str, list[str]]:
    settings = Settings(data_dir=data_dir)
    group = settings.cgroup_group
    sdir = data_dir / "sandboxes"
    found: dict[str, list[str]] = {
        "mounts": mounts.mounts_under(data_dir),
        "cgroups": sorted(
            f"{h.name}/{p.name}"
            for h in cgroups.CGROUP_ROOT.iterdir()
            if (h / group).is_dir()
            for p in (h / group).iterdir()
            if p.is_dir()
        ),
        "processes": [],
        "loop_devices": [],
        "directories": sorted(p.name for p in sdir.iterdir()) if sdir.is_dir() else [],
        "uid_ranges": [f"{base}: {sid}" for base, sid in Runtime(settings).uids.held().items()],
    }
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if (p / "stat").read_text().rpartition(")")[2].split()[0] == "Z":
                continue  # holds nothing but its pid; its adopter reaps it
            argv = (p / "cmdline").read_bytes().decode(errors="replace")
            cgroup = (p / "cgroup").read_text()
        except OSError:
            continue
        if f"/{group}/" in cgroup or f"/{group}/" in argv or f"{sdir}/" in argv:
            found["processes"].append(f"{p.name}: {argv.replace(chr(0), ' ')[:100]}")
    for b in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            backing = b.read_text().strip()
        except OSError:
            continue
        if backing.startswith(f"{data_dir}/"):
            found["loop_devices"].append(f"{b.parent.parent.name}: {backing}")
    return found


def counts(found: dict[str, list[str]]) -> dict[str, int]:
    return {k: len(v) for k, v in found.items()}


RECONCILE_LINE = re.compile(r"reconcile: (sandboxes=.*)")  # its Report, one line per run


def reconciled(log: Path) -> dict[str, int]:
    """What the servers' reconciles reported cleaning, summed over the whole run."""
    total: dict[str, int] = {}
    for m in RECONCILE_LINE.finditer(log.read_text(errors="replace")):
        for pair in m.group(1).split(", "):
            k, _, v = pair.partition("=")
            if v.isdigit() and k not in ("sandboxes", "in_flight"):
                total[k] = total.get(k, 0) + int(v)
    return total


def main() -> dict[str, object]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=10_000, help="create -> run -> kill cycles")
    ap.add_argument("--clients", type=int, default=4, help="client threads")
    ap.add_argument("--kill-every", type=int, default=1000, help="cycles between server kill -9")
    ap.add_argument("--out", default="bench/results/soak.json")
    args = ap.parse_args()

    data = Path(tempfile.mkdtemp(prefix="sandhold-soak-", dir="/var/tmp"))
    data.chmod(0o755)
    log = Path(tempfile.gettempdir()) / f"sandhold-soak-{data.name}.log"
    srv = Server(data, log)
    os.environ.update(E2B_API_URL=srv.url, E2B_SANDBOX_URL=srv.url, E2B_API_KEY=API_KEY,
                      NO_PROXY="127.0.0.1,localhost")  # fmt: skip
    os.environ.pop("E2B_DEBUG", None)
    result: dict[str, object] = {
        "host": {"kernel": platform.release(), "cpus": os.cpu_count(),
                 "loadavg_1m_at_start": round(os.getloadavg()[0], 2)},
        "sdk": f"e2b {package_version}",
        "cycles": args.cycles, "clients": args.clients, "kill_every": args.kill_every,
    }  # fmt: skip
    lives: list[dict[str, int]] = []
    mid_create = 0  # kills that fell while a create was in flight
    t0 = time.monotonic()
    clients = Clients(args.clients, args.cycles)
    try:
        srv.start()
        Sandbox.create(timeout=60).kill()  # warm-up: template, agent library
        clients.start()
        life_start = 0
        while True:
            # One server's life: warm up, count its fds idle, run to the next kill, count again.
            while clients.done < min(life_start + WARM_CYCLES, args.cycles):
                time.sleep(0.01)
            clients.hold()
            life = {"first_cycle": life_start, "fds_after_warmup": srv.fds()}
            clients.release()
            boundary = min(life_start + args.kill_every, args.cycles)
            while clients.done < boundary:
                time.sleep(0.01)
            clients.hold()
            life["fds_before_end"] = srv.fds()
            life["fd_growth"] = life["fds_before_end"] - life["fds_after_warmup"]
            lives.append(life)
            print(f"{clients.done} cycles, {clients.ok} ok: {life}", file=sys.stderr, flush=True)
            if boundary >= args.cycles:
                break
            clients.release()
            mid_create += creating(data)
            srv.kill9()
            srv.start()
            life_start = clients.done
        clients.release()
        clients.join()
        result["elapsed_s"] = round(time.monotonic() - t0, 1)
        result["server_kills"] = len(lives) - 1
        result["server_kills_during_a_create"] = mid_create
        result["cycles_ok"] = clients.ok
        result["cycles_interrupted"] = clients.errors
        result["cycle_ms"] = summary(clients.cycle_ms)
        with srv.api() as api:
            lost = [s["sandboxID"] for s in api.get("/sandboxes").json()]
            for sid in lost:
                api.delete(f"/sandboxes/{sid}")
        result["lost_but_listed"] = len(lost)
        found = leaks(data)
        if any(found.values()):  # what a run of the periodic reconcile would still remove
            result["leaks_before_periodic_reconcile"] = counts(found)
            time.sleep(getattr(Settings(), "reconcile_interval_s", 30) + 5)
            found = leaks(data)
        result["leaks"] = counts(found)
        if any(found.values()):
            result["leaked"] = found
        result["server_fd_growth_max"] = max(life["fd_growth"] for life in lives)
        result["server_lives"] = lives
        result["reconcile_cleaned"] = reconciled(log)
    finally:
        clients.cycles = 0
        clients.release()
        srv.stop()
        srv.sock.close()
        settings = Settings(data_dir=data)
        rt = Runtime(settings).open()
        for info in rt.list():
            rt.kill(info.id)
        cgroups.remove_parent(settings.cgroup_group)
        shutil.rmtree(data, ignore_errors=True)
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
