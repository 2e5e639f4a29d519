"""A tenant's ``workspace_disk_mb`` end to end, through real gateways over the local provider and
the e2b provider against a real `sandhold serve`: writes past it fail with ENOSPC inside the
session's sandbox, ``df`` shows it, its files outlive a reclaimed and a failed sandbox, a larger
budget grows it at the next sandbox, and closing the session (workspace deleted) leaves no
image, loop device or mount behind."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from sandhold.config import Settings
from sandhold.errors import SandboxNotFound, Unsupported
from sandhold.gateway.providers.base import CreateRequest
from sandhold.gateway.providers.e2b import E2bProvider
from sandhold.runtime import mounts
from sandhold.runtime.runtime import Runtime
from sandhold.runtime.wsdisk import IMAGE
from tests.security.test_disk_attacks import ENOSPC, MIB, loop_backings
from tests.support.gateway_server import FAST_POLICY, Gateway, tool, wait_for


def sandbox(gw: Gateway, session: str) -> dict | None:
    with gw.client() as c:
        return c.get(f"/v1/sessions/{session}").json()["sandbox"]


def set_policy(gw: Gateway, **policy: object) -> None:
    with gw.admin() as admin:
        r = admin.put("/v1/admin/tenants/acme", json={"policy": {**FAST_POLICY, **policy}})
        assert r.status_code == 200, r.text


def reclaimed(c: httpx.Client, session: str) -> bool:
    events = c.get(f"/v1/sessions/{session}/timeline").json()["events"]
    return any(e["kind"] == "sandbox_reclaimed" for e in events)


def size_of_workspace(gw: Gateway, session: str) -> int:
    with gw.client() as c:
        r = tool(c, session, "run_command", command="df -B1 --output=size /workspace | tail -1")
    return int(r["stdout"])


@pytest.mark.parametrize("provider", ["local", "e2b"])
def test_a_tenants_workspace_budget(make_gateway: Callable[..., Gateway], provider: str) -> None:
    gw = make_gateway(provider)
    with gw.admin() as admin:  # a budget below the smallest image is refused when written
        r = admin.put("/v1/admin/tenants/acme", json={"policy": {"workspace_disk_mb": 4}})
        assert r.status_code == 400 and "workspace_disk_mb" in r.text, r.text
    set_policy(gw, workspace_disk_mb=64, workspace_on_close="delete")
    s = "conv-budget"
    workspace = gw.workspaces / "acme" / s
    with gw.client() as c:
        r = tool(c, s, "run_command", command="echo kept > notes.txt; "
                 "dd if=/dev/zero of=fill bs=1M count=100 2>&1; echo rc=$?; rm fill")  # fmt: skip
        assert ENOSPC in r["stdout"] and "rc=0" not in r["stdout"], r
        assert size_of_workspace(gw, s) == 64 * MIB
        assert os.listdir(workspace) == [IMAGE]  # the files are in the image
        assert os.stat(workspace / IMAGE).st_blocks * 512 <= 64 * MIB
        assert len(loop_backings(workspace)) == 1
        first = sandbox(gw, s)["id"]

        # Reclaimed (paused 2 s past its 2 s keep-alive): the next sandbox has the files, and
        # the larger budget the tenant got meanwhile.
        wait_for(lambda: reclaimed(c, s))  # recorded once its kill has returned
        assert not loop_backings(workspace)
        set_policy(gw, workspace_disk_mb=96, workspace_on_close="delete", keep_alive_s=600,
                   retention_s=600)  # fmt: skip
        r = tool(c, s, "run_command", command="cat notes.txt")
        assert r["stdout"] == "kept\n", r
        second = sandbox(gw, s)["id"]
        assert second != first and size_of_workspace(gw, s) == 96 * MIB

        # Its agent dies: the next call gets a new sandbox over the same workspace at once (the
        # failed one, which still held the image, is killed first; the reclaimer would wait
        # for the retention).
        rt = gw.server.runtime() if gw.server else Runtime(Settings(data_dir=gw.data_dir))
        os.kill(rt.get(second).init_pid, signal.SIGKILL)
        # Dead before the next call (SIGKILL is delivered asynchronously: a call sent while the
        # agent is still exiting reaches it and fails, as a call during any agent death does).
        wait_for(lambda: rt.get(second).state == "failed")
        r = tool(c, s, "run_command", command="cat notes.txt")
        assert r["stdout"] == "kept\n", r
        third = sandbox(gw, s)["id"]
        assert third not in (first, second)
        with pytest.raises(SandboxNotFound):
            rt.get(second)
        assert len(loop_backings(workspace)) == 1

        assert c.delete(f"/v1/sessions/{s}").status_code == 200
    assert not workspace.exists()  # the image went with the workspace
    assert not loop_backings(gw.workspaces)
    data_dir = gw.server.data_dir if gw.server else gw.data_dir
    assert not [m for m in mounts.mounts_under(data_dir / "sandboxes") if "/workspace" in m]


def test_remote_flavors_that_cannot_cap_a_workspace_refuse_it(tmp_path: Path) -> None:
    """E2B cloud and CubeSandbox would ignore the budget: refused, never silently unenforced."""
    for flavor in ("cube", "e2b"):
        settings = Settings(data_dir=tmp_path, gateway_provider="e2b",
                            gateway_e2b_api_url="http://127.0.0.1:9",
                            gateway_e2b_flavor=flavor)  # fmt: skip
        provider = E2bProvider(settings)
        req = CreateRequest(template="base", timeout_s=60, metadata={}, env={},
                            workspace_dir=tmp_path, memory_mb=512, cpu=1, pids=512,
                            tenant="acme", workspace_disk_mb=64)  # fmt: skip
        try:
            with pytest.raises(Unsupported, match=f"the {flavor} flavor cannot cap"):
                asyncio.run(provider.create(req))
        finally:
            asyncio.run(provider.close())
