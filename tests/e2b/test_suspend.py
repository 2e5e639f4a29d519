"""Suspend to disk through the official SDK: a paused sandbox is checkpointed (here at once,
``suspend_after_s = 0``), survives a server restart and a host reboot (every process, mount and
cgroup of it gone from the host), and resumes, explicitly or on traffic, with its processes'
memory."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from e2b import Sandbox

from tests.counter import COUNTER
from tests.runtime.test_suspend import reboot
from tests.support.e2b_server import Server, needs_criu, new_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    needs_criu()
    srv = new_server(tmp_path_factory.mktemp("suspend"), suspend_after_s="0")
    srv.start()
    yield srv
    srv.destroy()


def state(sbx: Sandbox) -> tuple[int, str]:
    for _ in range(100):
        out = sbx.commands.run("cat /tmp/state 2>/dev/null || true").stdout.split()
        if out:
            return int(out[0]), out[1]
        time.sleep(0.02)
    raise AssertionError("the counter never wrote its state")


def test_suspended_sandbox_survives_a_reboot_and_resumes_with_its_memory(server):
    sbx = Sandbox.create(timeout=300, **server.sdk())
    try:
        sbx.commands.run(COUNTER, background=True)
        n0, secret = state(sbx)
        assert sbx.pause()
        rt = server.runtime()
        info = rt.get(sbx.sandbox_id)
        assert info.suspended == "disk" and rt.cgroup(info.id).pids() == []
        server.stop()
        reboot(rt, info)  # the host, rebooted meanwhile
        server.start()
        resumed = Sandbox.connect(sbx.sandbox_id, timeout=300, **server.sdk())
        time.sleep(0.1)
        n1, secret1 = state(resumed)
        assert secret1 == secret and n1 > n0  # the same process, from its own memory
        assert resumed.files.read("/tmp/state").split()[1] == secret
    finally:
        sbx.kill()


def test_traffic_resumes_a_suspended_sandbox(server):
    sbx = Sandbox.create(timeout=300, lifecycle={"on_timeout": "pause", "auto_resume": True},
                         **server.sdk())  # fmt: skip
    try:
        sbx.commands.run(COUNTER, background=True)
        n0, secret = state(sbx)
        sbx.pause()
        assert server.runtime().get(sbx.sandbox_id).suspended == "disk"
        n1, secret1 = state(sbx)  # a command: the data plane resumes it first
        assert secret1 == secret and n1 >= n0
        assert sbx.is_running()
    finally:
        sbx.kill()
