"""The gateway, unchanged, on a fleet (docs/fleet.md): its `e2b` provider pointed at the edge;
session workspaces on storage every host mounts at the same path (here, one directory of this
machine, as NFS would be). A session whose sandbox's host dies goes on in a new sandbox on the
other host, with its workspace."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx

from sandhold.runtime import safefs
from tests.fleet.harness import Edge, catalog_url, host_of, new_host, running, wait_for
from tests.support.e2b_server import KEY_A
from tests.support.gateway_server import Gateway, gateway_env, scratch_dir, tool


def test_a_session_outlives_its_sandboxs_host_through_the_edge(postgres, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data_dir = scratch_dir("sandhold-fleet-gateway-")
    workspaces = data_dir / "workspaces"
    workspaces.mkdir(mode=0o755)
    hosts = [
        new_host(tmp_path, f"g{i}", host_mount_roots=json.dumps([str(workspaces)])) for i in (1, 2)
    ]
    edge = Edge(tmp_path, catalog_url(postgres), hosts)
    gateway = Gateway(
        data_dir,
        gateway_env(data_dir, "e2b", edge, "fleet"),  # type: ignore[arg-type]
        tmp_path / "gateway.log",
    )
    try:
        with running(hosts, [edge]):
            gateway.start()
            with gateway.client() as c:
                r = tool(c, "s1", "run_command", command="echo kept > notes.txt; pwd")
                assert r["exit_code"] == 0 and r["stdout"].strip() == "/workspace", r
                first_id = c.get("/v1/sessions/s1").json()["sandbox"]["id"]
                first = next(h for h in hosts if host_of(h, first_id))
                other = next(h for h in hosts if h is not first)

                first.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
                first.proc.wait()  # type: ignore[union-attr]
                first.sock.close()
                url = f"{edge.url}/sandboxes/{first_id}"
                wait_for(
                    lambda: httpx.get(url, headers={"X-API-KEY": KEY_A}).status_code == 404,
                    30,
                    "the edge to judge the host lost",
                )
                r = tool(c, "s1", "run_command", command="cat notes.txt")
                assert r["exit_code"] == 0 and r["stdout"].strip() == "kept", r
                second_id = c.get("/v1/sessions/s1").json()["sandbox"]["id"]
                assert second_id != first_id and host_of(other, second_id)
            first.proc = None  # (the fixture's destroy cleans what the kill left)
    finally:
        gateway.close()
        safefs.remove_quietly(data_dir)
