"""The three-stage lifecycle end to end, with the `local` provider and with the `e2b` provider
against a real `sandhold serve`: first call creates, idle pauses, the next call resumes with a
file and a running background process intact, long idle reclaims, the next call recreates
over the same workspace, and the timeline tells that story."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import sqlite3
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from sandhold.config import Settings
from sandhold.runtime.runtime import Runtime
from tests.support.gateway_server import FAST_POLICY, Gateway, tool, wait_for

PROVIDERS = ["local", "e2b"]


def sandbox(gw: Gateway, session: str) -> dict | None:
    with gw.client() as c:
        return c.get(f"/v1/sessions/{session}").json()["sandbox"]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_three_stages(make_gateway: Callable[..., Gateway], provider: str) -> None:
    gw = make_gateway(provider)
    s = "conv-1"
    with gw.client() as c:
        # No session and no sandbox before the first execution.
        assert c.get(f"/v1/sessions/{s}").status_code == 404

        # 1. create on the first call, tagged, with the workspace at /workspace
        r = tool(c, s, "run_command", command="echo kept > notes.txt; pwd")
        assert r["exit_code"] == 0 and r["stdout"].strip() == "/workspace"
        first = sandbox(gw, s)
        assert first is not None and first["state"] == "running"
        tool(c, s, "run_command", command="echo in-memory > /tmp/scratch; cd /tmp")
        bg = tool(c, s, "run_command", command="exec sleep 600", background=True)
        assert bg["pid"] > 0

        # 2. idle: the provider pauses it (keep-alive 2 s); status never resumes it
        wait_for(lambda: (sandbox(gw, s) or {}).get("state") == "paused")
        # ... and the next call resumes the same sandbox, /tmp and the process intact
        r = tool(c, s, "run_command", command=f"cat /tmp/scratch notes.txt; kill -0 {bg['pid']}")
        assert r["exit_code"] == 0, r
        assert r["stdout"].split() == ["in-memory", "kept"]
        assert sandbox(gw, s)["id"] == first["id"]

        # 3. paused longer than the retention: reclaimed (the workspace stays)
        wait_for(lambda: sandbox(gw, s) is None)
        r = tool(c, s, "run_command", command="cat notes.txt; ls /tmp/scratch")
        assert r["stdout"].strip() == "kept"  # same workspace ...
        assert r["exit_code"] != 0  # ... fresh sandbox: /tmp is new
        second = sandbox(gw, s)
        assert second["id"] != first["id"]

        events = c.get(f"/v1/sessions/{s}/timeline").json()["events"]
    kinds = [e["kind"] for e in events if e["kind"] != "tool_call"]
    assert kinds[:2] == ["session_opened", "sandbox_created"]
    story = [k for k in kinds if k in ("sandbox_created", "sandbox_paused", "sandbox_resumed",
                                        "sandbox_reclaimed")]  # fmt: skip
    # created, paused, resumed, (paused again), reclaimed, created
    assert story[:3] == ["sandbox_created", "sandbox_paused", "sandbox_resumed"]
    assert story[-2:] == ["sandbox_reclaimed", "sandbox_created"]
    reclaimed = next(e for e in events if e["kind"] == "sandbox_reclaimed")
    assert reclaimed["sandbox_id"] == first["id"]
    assert reclaimed["provider_state"]["state"] == "paused"
    assert "retention" in reclaimed["reason"]
    calls = [e for e in events if e["kind"] == "tool_call"]
    assert len(calls) == 5 and all(e["tool"] == "run_command" for e in calls)
    assert all("duration_ms" in e and "bytes_in" in e for e in calls)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_failed_sandbox_is_recorded_as_failed(
    make_gateway: Callable[..., Gateway], provider: str
) -> None:
    """Its agent dies (killed from the host: a bug, say) and the reclaimer sees it first: the
    timeline says it failed, and why, never that it paused; it is reclaimed after the retention
    and the next call gets a new sandbox over the same workspace."""
    gw = make_gateway(provider)
    with gw.admin() as admin:  # a keep-alive that outlasts the test: no pause of its own
        policy = {**FAST_POLICY, "keep_alive_s": 600}
        assert admin.put("/v1/admin/tenants/acme", json={"policy": policy}).status_code == 200
    s = "conv-failed"
    with gw.client() as c:
        tool(c, s, "run_command", command="echo kept > notes.txt")
        first = sandbox(gw, s)["id"]
        rt = gw.server.runtime() if gw.server else Runtime(Settings(data_dir=gw.data_dir))
        os.kill(rt.get(first).init_pid, signal.SIGKILL)

        def of_first() -> list[dict[str, Any]]:
            events = c.get(f"/v1/sessions/{s}/timeline").json()["events"]
            return [e for e in events if e.get("sandbox_id") == first and e["kind"] != "tool_call"]

        # The reclaimer runs every 0.5 s; its record follows the kill's return (the status
        # shows no sandbox as soon as the kill has begun).
        wait_for(lambda: any(e["kind"] == "sandbox_reclaimed" for e in of_first()))
        mine = events = of_first()
        assert [e["kind"] for e in mine] == [
            "sandbox_created",
            "sandbox_failed",
            "sandbox_reclaimed",
        ], events
        failed, reclaimed = mine[1], mine[2]
        assert "failed" in failed["reason"] and "signal 9" in failed["reason"], failed
        assert failed["provider_state"]["state"] == "paused"
        assert "signal 9" in failed["provider_state"]["failure"]
        assert reclaimed["reason"].startswith("failed for "), reclaimed
        assert tool(c, s, "run_command", command="cat notes.txt")["stdout"] == "kept\n"
        assert sandbox(gw, s)["id"] != first


@pytest.mark.parametrize("provider", PROVIDERS)
def test_tags_workspace_and_close(make_gateway: Callable[..., Gateway], provider: str) -> None:
    gw = make_gateway(provider, gateway_tag_prefix="lea.")
    with gw.client() as c:
        tool(c, "conv-2", "write_file", path="report.txt", content="done")
        sbx = sandbox(gw, "conv-2")
        assert sbx is not None
        meta = gw.sandbox_metadata(sbx["id"])
        assert meta["lea.session_id"] == "conv-2" and meta["lea.tenant_id"] == "acme"
        assert "host-mount" not in meta  # the server keeps it out of user-visible metadata
        # the workspace is the host directory <root>/<tenant>/<session>
        assert (gw.workspaces / "acme" / "conv-2" / "report.txt").read_text() == "done"

        closed = c.delete("/v1/sessions/conv-2").json()
        assert closed["sandbox_killed"] == sbx["id"] and not closed["workspace_deleted"]
        assert sandbox(gw, "conv-2") is None
        r = c.post("/v1/sessions/conv-2/tools/run_command", json={"command": "true"})
        assert r.status_code == 409 and r.json()["code"] == "session_closed"
        events = c.get("/v1/sessions/conv-2/timeline").json()["events"]
    assert [e["kind"] for e in events][-2:] == ["session_closed", "tool_call"]
    assert events[-1]["error"].startswith("session_closed")
    assert (gw.workspaces / "acme" / "conv-2" / "report.txt").exists()  # policy: keep


def test_concurrent_first_calls_do_not_overshoot_the_quota(
    make_gateway: Callable[..., Gateway],
) -> None:
    """Eight sessions' first calls at once against max_live_sandboxes=2: two sandboxes, six
    clear refusals (each create sees the creates in flight that locked before it)."""
    gw = make_gateway("local")
    policy = {**FAST_POLICY, "keep_alive_s": 300, "max_live_sandboxes": 2}
    with gw.admin() as admin:
        assert admin.put("/v1/admin/tenants/acme", json={"policy": policy}).status_code == 200

    def first_call(i: int) -> httpx.Response:
        with gw.client() as c:
            return c.post(f"/v1/sessions/q{i}/tools/run_command", json={"command": "true"})

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(first_call, range(8)))
    ok = [r for r in answers if r.status_code == 200]
    refused = [r for r in answers if r.status_code == 429]
    assert len(ok) == 2 and len(refused) == 6, [(r.status_code, r.text) for r in answers]
    assert all(r.json()["code"] == "quota_exceeded" for r in refused)
    with gw.admin() as admin:
        stats = admin.get("/v1/admin/tenants/acme/stats").json()
    assert stats["live_sandboxes"] == 2, stats


def test_prepare_readies_the_sandbox_before_the_first_call(
    make_gateway: Callable[..., Gateway],
) -> None:
    gw = make_gateway("local")
    with gw.client() as c:
        r = c.post("/v1/sessions/p1/prepare")
        assert r.status_code == 200, r.text
        sandbox = r.json()["sandbox"]
        assert sandbox["state"] == "running"
        created = [e for e in c.get("/v1/sessions/p1/timeline").json()["events"]
                   if e["kind"] == "sandbox_created"]  # fmt: skip
        assert [e["reason"] for e in created] == ["first prepare call of the session"]
        # the first tool call finds it ready: same sandbox, nothing created
        assert tool(c, "p1", "run_command", command="true")["exit_code"] == 0
        events = c.get("/v1/sessions/p1/timeline").json()["events"]
        assert [e["kind"] for e in events].count("sandbox_created") == 1
        assert c.get("/v1/sessions/p1").json()["sandbox"]["id"] == sandbox["id"]

        # without waiting: 202 at once, the sandbox follows
        r = c.post("/v1/sessions/p2/prepare", params={"wait": "false"})
        assert r.status_code == 202 and r.json() == {"session_id": "p2", "preparing": True}
        wait_for(lambda: (c.get("/v1/sessions/p2").json().get("sandbox") or {}).get("state")
                 == "running")  # fmt: skip

        # bad input and closed sessions get clear errors and change nothing
        r = c.post("/v1/sessions/p3/prepare", params={"wait": "maybe"})
        assert r.status_code == 400 and "wait" in r.json()["message"]
        assert c.get("/v1/sessions/p3").status_code == 404
        r = c.post("/v1/sessions/bad id!/prepare")
        assert r.status_code == 400 and r.json()["code"] == "invalid_argument"
        assert c.delete("/v1/sessions/p1").status_code == 200
        r = c.post("/v1/sessions/p1/prepare")
        assert r.status_code == 409 and r.json()["code"] == "session_closed"


def test_provider_tokens_are_sealed_at_rest(make_gateway: Callable[..., Gateway]) -> None:
    """The e2b provider's envd token (full control of the sandbox) never lies in the store in
    the clear, and a sealed handle copied onto another session's row does not open there."""
    gw = make_gateway("e2b")
    assert gw.server is not None
    with gw.client() as c:
        tool(c, "t1", "run_command", command="true")
        tool(c, "t2", "run_command", command="true")
        sandbox_id = c.get("/v1/sessions/t1").json()["sandbox"]["id"]
    envd_token = gw.server.runtime().get(sandbox_id).extra["lifecycle"]["access_token"]
    stored = b"".join(f.read_bytes() for f in (gw.data_dir / "gateway").glob("gateway.db*"))
    assert stored and envd_token.encode() not in stored

    db = sqlite3.connect(gw.data_dir / "gateway" / "gateway.db")
    with db:
        (handle,) = db.execute(
            "SELECT sandbox_handle FROM sessions WHERE session_id='t1'"
        ).fetchone()
        assert "sealed" in json.loads(handle) and "envd_token" not in json.loads(handle)
        db.execute("UPDATE sessions SET sandbox_handle=? WHERE session_id='t2'", (handle,))
    db.close()
    with gw.client() as c:
        r = c.post("/v1/sessions/t2/tools/run_command", json={"command": "true"})
        assert r.status_code == 502 and "do not open" in r.json()["message"], r.text
        assert tool(c, "t1", "run_command", command="echo still")["stdout"] == "still\n"
