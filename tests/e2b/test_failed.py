"""A sandbox whose agent dies (killed from the host here: a bug, the OOM killer) is reported:
marked failed (paused for good on the E2B surface), one WARNING line in the server's log, and
``sandhold_sandboxes_failed_total`` on ``GET /metrics`` counts it once, by reason."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import httpx
from e2b import Sandbox, SandboxState

from tests.support.e2b_server import KEY_A, Server, new_server

METRIC = re.compile(r'^sandhold_sandboxes_failed_total\{reason="(\w+)"\} (\d+)$', re.M)


def failed_counts(srv: Server) -> dict[str, int]:
    with srv.api() as api:
        r = api.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "# TYPE sandhold_sandboxes_failed_total counter" in r.text
    return {reason: int(n) for reason, n in METRIC.findall(r.text)}


def kill_agent(srv: Server, sandbox_id: str) -> None:
    os.kill(srv.runtime().get(sandbox_id).init_pid, signal.SIGKILL)


def wait_failed(sandbox_id: str, opts: dict[str, str]) -> None:
    deadline = time.monotonic() + 30
    while Sandbox.get_info(sandbox_id, **opts).state != SandboxState.PAUSED:
        assert time.monotonic() < deadline, "the sandbox was never marked failed"
        time.sleep(0.1)


def test_a_sandbox_whose_agent_died_is_counted_logged_and_kept(tmp_path: Path) -> None:
    srv = new_server(tmp_path)
    opts = {"api_url": srv.url, "sandbox_url": srv.url, "api_key": KEY_A}
    srv.start()
    try:
        with httpx.Client(base_url=srv.url) as anonymous:
            assert anonymous.get("/metrics").status_code == 401  # behind the API keys
        assert failed_counts(srv) == {"oom": 0, "signal": 0, "exit": 0, "unknown": 0}
        sbx = Sandbox.create(timeout=600, **opts)
        survivor = Sandbox.create(timeout=600, **opts)
        kill_agent(srv, sbx.sandbox_id)
        wait_failed(sbx.sandbox_id, opts)
        assert srv.runtime().get(sbx.sandbox_id).state == "failed"
        # Killed by SIGKILL while the server was bwrap's parent: the reason is the signal.
        assert failed_counts(srv) == {"oom": 0, "signal": 1, "exit": 0, "unknown": 0}
        log = srv.log.read_text()
        assert len(re.findall(rf"sandbox {sbx.sandbox_id} failed: .*signal 9", log)) == 1, log
        # Counted once, however often it is read afterwards.
        Sandbox.list(**opts).next_items()
        Sandbox.get_info(sbx.sandbox_id, **opts)
        assert failed_counts(srv)["signal"] == 1

        # A restarted server does not count it again; one that died while no server ran is
        # counted by the server that finds it (its exit status went with its parent).
        srv.stop()
        kill_agent(srv, survivor.sandbox_id)
        srv.start()
        wait_failed(survivor.sandbox_id, opts)
        assert failed_counts(srv) == {"oom": 0, "signal": 0, "exit": 0, "unknown": 1}
        assert Sandbox.get_info(sbx.sandbox_id, **opts).state == SandboxState.PAUSED
        assert sbx.kill() is True and survivor.kill() is True
        assert failed_counts(srv)["unknown"] == 1  # a counter: kills do not lower it
    finally:
        srv.destroy()
