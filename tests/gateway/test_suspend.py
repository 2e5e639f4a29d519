"""Suspend to disk under the gateway, with the `local` provider and with the `e2b` provider
against a real `sandhold serve`: a session's sandbox auto-paused by its keep-alive is suspended
by whoever runs it (here at once, ``suspend_after_s = 0``); nothing of the gateway (status
reads, reclaim passes short of the retention) resumes it; the next tool call restores it, its
processes carrying on from their own memory."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from sandhold.config import Settings
from sandhold.runtime.checkpoint.criu import criu_status
from sandhold.runtime.runtime import Runtime
from tests.counter import COUNTER
from tests.support.e2b_server import Server, new_server
from tests.support.gateway_server import TENANT_KEY, Gateway, tool, wait_for

PROVIDERS = ["local", "e2b"]
# Paused after 1 s idle; reclaimed only after an hour.
TENANTS = {"acme": {"api_key": TENANT_KEY, "policy": {
    "keep_alive_s": 1, "retention_s": 3600, "max_command_timeout_s": 120}}}  # fmt: skip


CRIU_USABLE, CRIU_DETAIL = criu_status(Settings().criu_path)
pytestmark = pytest.mark.skipif(not CRIU_USABLE, reason=f"CRIU unusable here: {CRIU_DETAIL}")


@pytest.fixture(scope="module")
def suspending_server(
    tmp_path_factory: pytest.TempPathFactory, workspace_root: Path
) -> Iterator[Server]:
    srv = new_server(
        tmp_path_factory.mktemp("gw-suspend"),
        host_mount_roots=json.dumps([str(workspace_root)]),
        lifecycle_interval_s="0.2",
        suspend_after_s="0",
    )
    srv.start()
    yield srv
    srv.destroy()


def sandbox(c: httpx.Client, session: str) -> dict | None:
    return c.get(f"/v1/sessions/{session}").json()["sandbox"]


def suspended(c: httpx.Client, session: str) -> bool:
    sbx = sandbox(c, session) or {}
    assert "failure" not in sbx, f"the sandbox failed instead of being suspended: {sbx}"
    return sbx.get("suspended") == "disk"


def state(c: httpx.Client, session: str) -> tuple[int, str] | None:
    out = tool(c, session, "run_command", command="cat /tmp/state 2>/dev/null || true")
    words = out["stdout"].split()
    return (int(words[0]), words[1]) if words else None


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_paused_session_is_suspended_and_its_next_call_restores_it(
    make_gateway: Callable[..., Gateway], provider: str, request: pytest.FixtureRequest
) -> None:
    extra: dict[str, object] = {"gateway_tenants": json.dumps(TENANTS)}
    if provider == "local":
        gw = make_gateway("local", suspend_after_s=0, **extra)
        runtime = Runtime(Settings(data_dir=gw.data_dir))
    else:
        server: Server = request.getfixturevalue("suspending_server")
        gw = make_gateway("e2b", server=server, **extra)
        runtime = server.runtime()
    s = "conv-suspended"
    with gw.client() as c, gw.admin() as admin:
        tool(c, s, "run_command", command=COUNTER, background=True)
        n0, secret = wait_for(lambda: state(c, s))
        status = c.get(f"/v1/sessions/{s}").json()
        assert status["capabilities"]["suspends_to_disk"] is True
        sid = status["sandbox"]["id"]

        # Idle: paused by the keep-alive, then suspended to disk; the gateway shows it.
        wait_for(lambda: suspended(c, s))
        assert runtime.get(sid).suspended == "disk" and runtime.cgroup(sid).pids() == []
        assert runtime.get(sid).state == "paused", runtime.get(sid).failure

        # Nothing of the gateway's lifecycle wakes it: reclaim passes (its own every 0.5 s and
        # one asked for), status reads.
        report = admin.post("/v1/admin/reclaim").json()
        assert report["paused"] == 1 and report["reclaimed"] == 0, report
        time.sleep(1.5)
        for _ in range(3):
            now = sandbox(c, s)
            assert now is not None and now["suspended"] == "disk" and "failure" not in now, now
        info = runtime.get(sid)
        assert (info.state, info.suspended) == ("paused", "disk")
        assert runtime.cgroup(sid).pids() == []

        # The next call restores it: the same process, from its own memory.
        n1, secret1 = state(c, s)  # type: ignore[misc]
        assert secret1 == secret and n1 > n0
        now = sandbox(c, s)
        assert now is not None and now["id"] == sid and now["state"] == "running"
        assert "suspended" not in now
        events = c.get(f"/v1/sessions/{s}/timeline").json()["events"]
    story = [e["kind"] for e in events if e["kind"] in ("sandbox_created", "sandbox_paused",
                                                        "sandbox_resumed")]  # fmt: skip
    assert story == ["sandbox_created", "sandbox_paused", "sandbox_resumed"]
    resumed = next(e for e in events if e["kind"] == "sandbox_resumed")
    assert resumed["provider_state"]["suspended"] == "disk"
