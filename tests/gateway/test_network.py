"""The tenant policy's ``network``: egress of a session's sandbox set by the operator's policy,
with the tenant's credentials injected by the egress proxy, changed on live sandboxes at their
next tool call. Against the egress tests' private internet (never an outside address)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandhold.config import Settings
from sandhold.egress.secrets import open_store
from tests.egress.fixtures import daemon_pids, internet  # noqa: F401
from tests.egress.internet import Internet
from tests.support.e2b_server import Server, new_server
from tests.support.gateway_server import FAST_POLICY, OTHER_KEY, Gateway, tool

TOKEN = "sk-gateway-tenant-7Hq2LmZ9"
TEAM_TOKEN = "sk-whole-team-Vb41xQe0"
# Long keep-alive: these tests watch one sandbox across policy changes.
POLICY = {**FAST_POLICY, "keep_alive_s": 300, "retention_s": 600}
STATUS = "curl -s -o /dev/null -w '%{{http_code}}' --max-time 10 {url} || true"


def auth_of(token: str) -> str:
    """What the test internet's /auth answers for ``Authorization: Bearer <token>``."""
    return "auth-sha256=" + hashlib.sha256(f"Bearer {token}".encode()).hexdigest()


def put_network(gw: Gateway, network: Any, tenant: str = "acme") -> httpx.Response:
    with gw.admin() as admin:
        return admin.put(
            f"/v1/admin/tenants/{tenant}", json={"policy": {**POLICY, "network": network}}
        )


def status(c: httpx.Client, session: str, url: str) -> str:
    return str(tool(c, session, "run_command", command=STATUS.format(url=url))["stdout"])


def events(c: httpx.Client, session: str) -> list[dict[str, Any]]:
    r = c.get(f"/v1/sessions/{session}/timeline")
    assert r.status_code == 200, r.text
    return list(r.json()["events"])


def sandbox_of(c: httpx.Client, session: str) -> str:
    r = c.get(f"/v1/sessions/{session}")
    assert r.status_code == 200, r.text
    return str(r.json()["sandbox"]["id"])


def test_tenant_network_policy_reaches_the_sandbox_and_follows_changes(
    make_gateway: Callable[..., Gateway],
    internet: Internet,  # noqa: F811
) -> None:
    gw = make_gateway("local", **internet.server_settings())
    open_store(Settings(data_dir=gw.data_dir)).set("acme", "api", TOKEN, ["api.example.test"])
    assert put_network(gw, {"mode": "allowlist", "allow": ["api.example.test"]}).status_code == 200
    with gw.client() as c:
        out = tool(c, "net", "run_command",
                   command="curl -sS --max-time 10 https://api.example.test/auth")  # fmt: skip
        assert out["stdout"] == auth_of(TOKEN), out  # injected by the proxy, for this tenant
        env = tool(c, "net", "run_command", command="env; cat /proc/self/environ")["stdout"]
        assert TOKEN not in env
        assert status(c, "net", "http://other.example.test/") == "403"
        first = sandbox_of(c, "net")
        tool(c, "net", "write_file", path="/workspace/kept.txt", content="still here")

        # A rule change reaches the same, live sandbox at its next call.
        r = put_network(gw, {"mode": "allowlist", "allow": ["other.example.test"]})
        assert r.status_code == 200, r.text
        assert status(c, "net", "http://other.example.test/") == "200"
        assert status(c, "net", "http://api.example.test/") == "403"
        assert sandbox_of(c, "net") == first
        updated = [e for e in events(c, "net") if e["kind"] == "sandbox_network_updated"]
        assert len(updated) == 1 and "other.example.test" in updated[0]["reason"]

        # Internal ranges stay closed even in open mode.
        assert put_network(gw, "open").status_code == 200
        assert status(c, "net", "http://evil.test/") == "200"
        assert status(c, "net", "http://rebind.example.test/") == "403"

        # Back to none: the proxy goes away, which needs a new sandbox (same workspace).
        assert put_network(gw, "none").status_code == 200
        out = tool(c, "net", "run_command",
                   command="curl -sS --max-time 5 http://evil.test/; echo rc=$?")  # fmt: skip
        assert "rc=0" not in out["stdout"], out
        assert sandbox_of(c, "net") != first
        assert tool(c, "net", "read_file", path="/workspace/kept.txt")["content"] == "still here"
        replaced = [e for e in events(c, "net") if e["kind"] == "sandbox_replaced"]
        assert len(replaced) == 1 and replaced[0]["sandbox_id"] == first

        # Another tenant (policy default: none) has no way out, and none of acme's secrets.
        with gw.client(key=OTHER_KEY) as other:
            get = "curl -sS --max-time 5 https://api.example.test/auth; echo rc=$?"
            out = tool(other, "g", "run_command", command=get)
            assert "rc=0" not in out["stdout"] and "auth-sha256" not in out["stdout"], out


def test_bad_network_policy_is_refused_and_changes_nothing(
    make_gateway: Callable[..., Gateway],
) -> None:
    gw = make_gateway("local")
    assert put_network(gw, {"mode": "allowlist", "allow": ["api.example.test"]}).status_code == 200
    for bad, words in [
        ({"mode": "bridge"}, "mode"),
        ({"mode": "allowlist", "allow": ["https://api.example.test"]}, "no scheme or port"),
        ({"mode": "open", "deny": ["10.0.0.0/33"]}, "not a valid IP address or CIDR"),
        ({"mode": "open", "proxy": "x"}, "proxy"),
    ]:
        r = put_network(gw, bad)
        assert r.status_code == 400, r.text
        assert r.json()["code"] == "invalid_argument" and words in r.json()["message"], r.text
    with gw.admin() as admin:
        policy = admin.get("/v1/admin/tenants/acme").json()["policy"]
    assert policy["network"] == {"mode": "allowlist", "allow": ["api.example.test"], "deny": []}


@pytest.fixture(scope="module")
def egress_e2b_server(
    tmp_path_factory: pytest.TempPathFactory,
    workspace_root: Path,
    internet: Internet,  # noqa: F811
) -> Iterator[Server]:
    srv = new_server(
        tmp_path_factory.mktemp("gw-e2b-egress"),
        host_mount_roots=json.dumps([str(workspace_root)]),
        lifecycle_interval_s="0.2",
        prebuild_templates="[]",
        egress_e2b_enabled="true",
        **internet.server_settings(),
    )
    srv.start()
    store = open_store(Settings(data_dir=srv.data_dir))
    store.set("team-a", "api", TEAM_TOKEN, ["api.example.test"])  # the API key's team's own
    store.set("team-a:acme", "api", TOKEN, ["api.example.test"])  # its gateway tenant acme's
    yield srv
    srv.destroy()
    assert not daemon_pids(srv.data_dir)


def test_e2b_provider_sends_the_policy_as_e2b_egress_options(
    make_gateway: Callable[..., Gateway],
    egress_e2b_server: Server,
) -> None:
    """Over the E2B API the policy becomes allow_internet_access / allowOut / denyOut, and rule
    changes go through PUT /sandboxes/{id}/network; a Sandhold server injects the secrets of
    "<team>:<gateway tenant>", not the whole team's."""
    gw = make_gateway("e2b", server=egress_e2b_server)
    assert put_network(gw, {"mode": "allowlist", "allow": ["api.example.test"]}).status_code == 200
    with gw.client() as c:
        out = tool(c, "e", "run_command",
                   command="curl -sS --max-time 10 https://api.example.test/auth")  # fmt: skip
        assert out["stdout"] == auth_of(TOKEN), out  # acme's, not TEAM_TOKEN
        assert status(c, "e", "http://other.example.test/") == "403"
        sandbox = sandbox_of(c, "e")
        with egress_e2b_server.api() as api:
            info = api.get(f"/sandboxes/{sandbox}").json()
        assert info["allowInternetAccess"] is False, info

        assert put_network(gw, {"mode": "allowlist", "allow": ["other.example.test"]}
                           ).status_code == 200  # fmt: skip
        assert status(c, "e", "http://other.example.test/") == "200"
        assert status(c, "e", "http://api.example.test/") == "403"
        assert sandbox_of(c, "e") == sandbox
        # The rules change, the secrets' scope stays.
        r = put_network(gw, {"mode": "allowlist", "allow": ["api.example.test"]})
        assert r.status_code == 200, r.text
        out = tool(c, "e", "run_command",
                   command="curl -sS --max-time 10 https://api.example.test/auth")  # fmt: skip
        assert out["stdout"] == auth_of(TOKEN), out


def test_a_secrets_scope_is_validated_and_kept_out_of_the_metadata(
    egress_e2b_server: Server,
) -> None:
    def create(scope: str) -> httpx.Response:
        body = {"templateID": "base", "timeout": 60, "metadata": {"sandhold.secrets-scope": scope}}
        return api.post("/sandboxes", json=body)

    with egress_e2b_server.api() as api:
        r = create("a:b")  # a scope cannot name another team's namespace
        assert r.status_code == 400 and "secrets-scope" in r.json()["message"], r.text
        r = create("acme")
        assert r.status_code == 201, r.text
        sandbox_id = r.json()["sandboxID"]
        try:
            assert (
                "sandhold.secrets-scope"
                not in api.get(f"/sandboxes/{sandbox_id}").json()["metadata"]
            )
            spec = egress_e2b_server.runtime().get(sandbox_id).spec
            assert spec.network.tenant == "team-a:acme"
        finally:
            api.delete(f"/sandboxes/{sandbox_id}")
