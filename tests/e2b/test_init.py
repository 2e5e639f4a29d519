"""`sandhold init` (cli/init.py) as the PID 1 of a pod's PID namespace, with `sandhold serve`
under it, driven by the official SDK: the server restarts in place (killed, it is started
again) and its sandboxes live on with their processes; orphans are reaped; a SIGTERM to the pod
ends the server and the init with it."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from e2b import Sandbox

from sandhold.runtime.reaping import ending
from tests.support.e2b_server import new_server
from tests.support.http import answers

# A pod's namespaces: its own PIDs and a /proc of them (the server writes its sandboxes' uid
# maps through /proc/<pid>), so its own mounts too.
POD = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGTERM",
       sys.executable, "-m", "sandhold.cli", "init", "--"]  # fmt: skip


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, state) of each child of ``pid``."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            state, ppid = stat.rpartition(")")[2].split()[:2]
            if int(ppid) == pid:
                out.append((int(d.name), state))
    return out


def the_server(init: int) -> int:
    for pid, _ in children(init):
        if b"serve" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    raise AssertionError(f"no server under the init {init}: {children(init)}")


def test_the_server_restarts_in_place_and_its_sandboxes_live_on(tmp_path) -> None:
    srv = new_server(tmp_path)
    srv.under, srv.pod = POD, True
    srv.start()
    try:
        assert srv.proc is not None
        (init, _), *_ = children(srv.proc.pid)  # unshare's child: PID 1 of the namespace
        sbx = Sandbox.create(timeout=300, **srv.sdk())
        sbx.commands.run("echo kept > /tmp/state; sleep 600 >/dev/null 2>&1 &")
        first = the_server(init)
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while (pids := [p for p, _ in children(init)]) and first in pids:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert answers(f"{srv.url}/health", 120), srv.log.read_text()[-3000:]
        assert the_server(init) != first
        again = Sandbox.connect(sbx.sandbox_id, timeout=300, **srv.sdk())
        r = again.commands.run("cat /tmp/state; pgrep -x sleep >/dev/null && echo alive")
        assert r.stdout.split() == ["kept", "alive"]  # the same processes, never restarted
        assert not [p for p, state in children(init) if state == "Z"]  # orphans reaped
        assert "starting it again" in srv.log.read_text()
        srv.stop()  # SIGTERM to the pod: to the init, which hands it to the server
        deadline = time.monotonic() + 60
        while not ending(init):  # gone, or a zombie not reaped yet
            assert time.monotonic() < deadline, "the init outlived its pod's stop"
            time.sleep(0.05)
        assert srv.log.read_text().count("Finished server process") == 1  # a clean stop
    finally:
        srv.destroy()
