"""`sandhold demo` (`make run`) stops the server it started, whatever stops the demo: SIGTERM
or SIGHUP as Ctrl-C does, a SIGKILL through the server's parent-death signal. Before, a demo
stopped with SIGTERM left an orphaned `sandhold serve` holding the port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.e2b_server import Server, new_server


def children(pid: int) -> set[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        out |= {int(c) for c in (task / "children").read_text().split()}
    return out


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
def test_the_demo_stops_its_server_whatever_stops_it(tmp_path: Path, sig: int) -> None:
    srv: Server = new_server(tmp_path)  # (its data dir and its cleanup; the demo binds the port)
    srv.sock.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_")}
    env.update(SANDHOLD_DATA_DIR=str(srv.data_dir), SANDHOLD_SERVER_PORT=str(srv.port),
               SANDHOLD_PREBUILD_TEMPLATES="[]", NO_PROXY="127.0.0.1,localhost")  # fmt: skip
    with open(tmp_path / "demo.log", "wb") as log:
        demo = subprocess.Popen([sys.executable, "-m", "sandhold.cli", "demo"], env=env,
                                stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not healthy(srv.port):
            assert demo.poll() is None, (tmp_path / "demo.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the demo's server never answered"
            time.sleep(0.1)
        servers = children(demo.pid)
        assert servers, "the demo runs its server as a child"
        demo.send_signal(sig)
        demo.wait(60)
        deadline = time.monotonic() + 30
        while any(alive(p) for p in servers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(p) for p in servers), "the server outlived its demo"
        assert not healthy(srv.port)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        srv.destroy()
