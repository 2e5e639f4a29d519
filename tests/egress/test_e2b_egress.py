"""The E2B surface of egress, driven by the official e2b SDK against a real `sandhold serve`
whose egress proxy uses the test internet."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator

import pytest
from e2b import Sandbox, SandboxException
from e2b.sandbox.network import ALL_TRAFFIC

from sandhold.config import Settings
from sandhold.egress.secrets import open_store
from tests.egress.fixtures import daemon_pids
from tests.egress.internet import Internet
from tests.egress.leaks import fetch_command, leaked, split
from tests.support.e2b_server import KEY_A, Server, new_server

GET = "curl -s -o /dev/null -w '%{{http_code}}' --max-time 10 {url} || true"
TOKEN = "e2b-team-token-9f8e7d6c"
SCOPED = "e2b-scoped-token-1a2b3c4d"  # team-a's secret of scope acme


@pytest.fixture(scope="module")
def egress_server(tmp_path_factory: pytest.TempPathFactory, internet: Internet) -> Iterator[Server]:
    srv = new_server(
        tmp_path_factory.mktemp("e2b-egress"),
        egress_e2b_enabled="true",
        **internet.server_settings(),
    )
    srv.start()
    store = open_store(Settings(data_dir=srv.data_dir))
    store.set("team-a", "token", TOKEN, ["api.example.test"])
    store.set("team-a:acme", "token", SCOPED, ["api.example.test"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("E2B_API_URL", srv.url)
        mp.setenv("E2B_SANDBOX_URL", srv.url)
        mp.setenv("E2B_API_KEY", KEY_A)
        mp.setenv("NO_PROXY", "127.0.0.1,localhost")
        yield srv
    srv.destroy()
    assert not daemon_pids(srv.data_dir)


def code(sbx: Sandbox, url: str) -> str:
    return sbx.commands.run(GET.format(url=url)).stdout


def test_allow_internet_access_opens_public_hosts_only(egress_server: Server) -> None:
    sbx = Sandbox.create(timeout=120, allow_internet_access=True)
    try:
        assert code(sbx, "https://evil.test/") == "200"
        assert code(sbx, "http://rebind.example.test/") == "403"
        assert sbx.get_info().allow_internet_access is True
    finally:
        sbx.kill()


def test_allow_out_is_an_allow_list_and_injects_the_team_credential(egress_server) -> None:
    sbx = Sandbox.create(
        timeout=120, network={"allow_out": ["api.example.test"], "deny_out": [ALL_TRAFFIC]}
    )
    try:
        r = sbx.commands.run("curl -sS --max-time 10 https://api.example.test/auth")
        assert r.stdout == "auth-sha256=" + hashlib.sha256(f"Bearer {TOKEN}".encode()).hexdigest()
        assert code(sbx, "https://other.example.test/") == "000"  # CONNECT refused: 403
        assert code(sbx, "http://other.example.test/") == "403"
        assert TOKEN not in sbx.commands.run("env").stdout
    finally:
        sbx.kill()


def test_update_network_on_a_running_sandbox(egress_server: Server) -> None:
    sbx = Sandbox.create(timeout=120)  # the server's default: no egress, but updatable
    try:
        assert code(sbx, "http://other.example.test/") == "403"
        sbx.update_network({"allow_out": ["other.example.test"], "deny_out": [ALL_TRAFFIC]})
        assert code(sbx, "http://other.example.test/") == "200"
        assert code(sbx, "http://api.example.test/") == "403"
        assert sbx.get_info().network["allow_out"] == ["other.example.test"]  # type: ignore[index]
        sbx.update_network({"allow_internet_access": False})
        assert code(sbx, "http://other.example.test/") == "403"
    finally:
        sbx.kill()


def test_bad_network_options_are_refused_and_change_nothing(egress_server: Server) -> None:
    with pytest.raises(SandboxException, match=r"network\.allowOut: egress rule 'http://x'"):
        Sandbox.create(timeout=60, network={"allow_out": ["http://x"]})
    sbx = Sandbox.create(timeout=60, network={"allow_out": ["api.example.test"]})
    try:
        with pytest.raises(SandboxException, match="not a valid"):
            sbx.update_network({"allow_out": ["bad..name"]})
        assert code(sbx, "http://api.example.test/") == "200"
    finally:
        sbx.kill()
    with egress_server.api() as api:
        r = api.put("/sandboxes/nosuchsandbox0000000/network", json={"allowOut": []})
        assert r.status_code == 404 and r.json()["code"] == 404


@pytest.mark.parametrize("scope", [None, "acme"])
def test_a_reflecting_upstream_hands_no_credential_back(egress_server, internet, scope) -> None:
    """Status line, header names, compressed, split and base64 bodies (tests/egress/reflector.py),
    for the team's secret and a scoped one, through the official SDK."""
    secret = SCOPED if scope else TOKEN
    auth = hashlib.sha256(f"Bearer {secret}".encode()).hexdigest()
    sbx = Sandbox.create(
        timeout=120,
        metadata={"sandhold.secrets-scope": scope} if scope else {},
        network={"allow_out": ["api.example.test"], "deny_out": [ALL_TRAFFIC]},
    )
    try:
        for mode in (
            "status",
            "header-name",
            "compressed-gzip",
            "compressed-br",
            "split",
            "encoded-base64",
        ):
            mark = internet.mark()
            out = sbx.commands.run(fetch_command(f"https://api.example.test/reflect/{mode}"))
            raw = base64.b64decode(out.stdout)
            got = [r["auth_sha256"] for r in internet.since(mark) if r.get("kind") == "https"]
            assert got == [auth], mode  # the credential reached the upstream
            assert split(raw)[0].startswith(b"HTTP/1.1 200"), raw[:100]
            assert not leaked(raw, secret) and not leaked(raw, TOKEN), (mode, raw)
        r = sbx.commands.run("curl -s -i https://api.example.test/reflect/status")
        assert "Reflected Bearer " + "*" * len(secret) in r.stdout and secret not in r.stdout
    finally:
        sbx.kill()
