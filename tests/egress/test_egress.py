"""The egress path end to end: real sandboxes, the host's egress daemon, and the test internet
(servers in a network namespace of their own, see internet.py)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal

import pytest

from sandhold import audit
from sandhold.config import Settings
from sandhold.errors import Conflict, InvalidRequest
from sandhold.runtime.runtime import Runtime
from tests.egress.fixtures import SECRET, TENANT, daemon_pids
from tests.egress.internet import Internet
from tests.runtime.helpers import py, sh

AUTH_HASH = hashlib.sha256(f"Bearer {SECRET}".encode()).hexdigest()


async def test_allowed_https_host_gets_the_credential_the_sandbox_never_sees(
    egress_sandbox, internet: Internet
):
    sbx = await egress_sandbox(allow=["api.example.test"])
    mark = internet.mark()
    r = await sh(sbx, "curl -sS --max-time 10 https://api.example.test/auth")
    assert r.exit_code == 0, r.stderr.decode()
    assert r.text == f"auth-sha256={AUTH_HASH}"
    r = await py(
        sbx,
        "import urllib.request as u; "
        "print(u.urlopen('https://api.example.test/auth', timeout=10).read().decode())",
    )
    assert r.exit_code == 0, r.stderr.decode()
    assert r.text.strip() == f"auth-sha256={AUTH_HASH}"
    got = [x for x in internet.since(mark) if x.get("path") == "/auth"]
    assert len(got) == 2 and all(x["auth_sha256"] == AUTH_HASH for x in got)
    env = await sh(sbx, "env; cat /proc/1/environ 2>/dev/null; cat /proc/self/environ")
    assert SECRET not in env.text


async def test_hosts_without_a_credential_rule_are_tunnelled_untouched(egress_sandbox, internet):
    sbx = await egress_sandbox(allow=["other.example.test"])
    r = await sh(sbx, "curl -sSv --max-time 10 https://other.example.test/auth 2>&1")
    assert r.exit_code == 0, r.text
    assert "sandhold test internet CA" in r.text  # the real server's certificate, end to end
    assert "auth-sha256=" + hashlib.sha256(b"").hexdigest() in r.text


async def test_denied_host_is_refused_at_once_with_the_rule(egress_sandbox, internet: Internet):
    sbx = await egress_sandbox(allow=["api.example.test"])
    mark = internet.mark()
    r = await sh(sbx, "curl -sS --max-time 10 https://evil.test/")
    assert r.exit_code == 56 and "403" in r.stderr.decode(), r.stderr.decode()
    r = await sh(sbx, "curl -sS --max-time 10 -i http://evil.test/")
    assert "403 Forbidden" in r.text
    assert "blocked by allowlist: evil.test is not in the allow list" in r.text
    r = await py(
        sbx,
        "import urllib.request as u, urllib.error as e\n"
        "try: u.urlopen('http://evil.test/', timeout=10)\n"
        "except e.HTTPError as x: print(x.code, x.read().decode())",
    )
    assert r.text.startswith("403 sandhold egress proxy: blocked by allowlist")
    assert not [x for x in internet.since(mark) if x.get("server") == internet.evil_ip]


async def test_mode_none_has_no_proxy_at_all(make_sandbox):
    sbx = await make_sandbox()
    r = await sh(
        sbx,
        "env | grep -ci proxy; ls /run/sandhold-egress; curl -sS --max-time 5 http://198.18.0.2/",
    )
    assert r.text.startswith("0")
    assert r.exit_code != 0


async def test_open_mode_reaches_public_names_but_never_internal_ones(egress_sandbox, internet):
    sbx = await egress_sandbox(mode="open", deny=["plain.example.test"])
    r = await sh(sbx, "curl -sS --max-time 10 https://evil.test/")
    assert r.exit_code == 0 and "via https" in r.text, r.stderr.decode()
    r = await sh(sbx, "curl -sS --max-time 10 -i http://plain.example.test/")
    assert "blocked by deny plain.example.test" in r.text
    r = await sh(sbx, "curl -sS --max-time 10 -i http://rebind.example.test/")
    assert "403" in r.text and "rebind.example.test resolves to 127.0.0.1" in r.text


async def test_rules_change_on_a_running_sandbox(egress_sandbox, egress_runtime: Runtime):
    sbx = await egress_sandbox(allow=["api.example.test"])
    get = "curl -s -o /dev/null -w '%{http_code}' --max-time 10 http://other.example.test/"
    assert (await sh(sbx, get)).text == "403"
    egress_runtime.update_network(
        sbx.id, {"mode": "allowlist", "allow": ["*.example.test"], "tenant": TENANT}
    )
    assert (await sh(sbx, get)).text == "200"
    with pytest.raises(InvalidRequest, match="not a valid domain"):
        egress_runtime.update_network(sbx.id, {"mode": "allowlist", "allow": ["bad..name"]})
    with pytest.raises(Conflict, match="created with network mode 'allowlist'"):
        egress_runtime.update_network(sbx.id, {"mode": "none"})
    assert (await sh(sbx, get)).text == "200"  # the refused updates changed nothing
    assert egress_runtime.get(sbx.id).spec.network.allow == ["*.example.test"]
    egress_runtime.update_network(sbx.id, {"mode": "allowlist", "tenant": TENANT})
    assert (await sh(sbx, get)).text == "403"


async def test_dns_is_answered_by_the_proxy_for_allowed_names_only(egress_sandbox, internet):
    sbx = await egress_sandbox(allow=["api.example.test"])
    r = await py(
        sbx,
        "import socket\nfor n in ('api.example.test', 'evil.test'):\n"
        "    try: print(n, socket.gethostbyname(n))\n"
        "    except OSError as e: print(n, 'error', e.errno)",
    )
    lines = r.text.splitlines()
    assert lines[0] == f"api.example.test {internet.api_ip}"
    assert lines[1].startswith("evil.test error")


async def test_every_request_is_audited_without_secrets(egress_sandbox, egress_settings: Settings):
    sbx = await egress_sandbox(allow=["api.example.test"], metadata={"session_id": "s-42"})
    await sh(
        sbx,
        "curl -s --max-time 10 https://api.example.test/auth?x=1; "
        "curl -s --max-time 10 https://evil.test/",
    )
    recs = audit.query(audit.egress_dir(egress_settings.data_dir), sandbox=sbx.id)
    mitm = [r for r in recs if r["kind"] == "mitm"]
    assert mitm and mitm[0]["host"] == "api.example.test" and mitm[0]["path"] == "/auth?x=1"
    assert mitm[0]["status"] == 200 and mitm[0]["injected"] == [f"{TENANT}/api-token"]
    assert mitm[0]["rule"] == "allow api.example.test" and mitm[0]["session"] == "s-42"
    denied = [r for r in recs if r["decision"] == "deny"]
    assert denied and denied[0]["host"] == "evil.test" and denied[0]["rule"] == "allowlist"
    for f in (egress_settings.data_dir / "egress" / "audit").iterdir():
        assert SECRET not in f.read_text()
    assert SECRET not in (egress_settings.data_dir / "egress" / "daemon.log").read_text()


async def test_egress_comes_back_when_the_runtime_reattaches(egress_sandbox, egress_settings):
    sbx = await egress_sandbox(allow=["api.example.test"])
    get = "curl -s -o /dev/null -w '%{http_code}' --max-time 10 http://api.example.test/"
    assert (await sh(sbx, get)).text == "200"
    for pid in daemon_pids(egress_settings.data_dir):
        os.kill(pid, signal.SIGKILL)  # the daemon (or the whole host service) crashed
    await asyncio.sleep(0.2)
    assert (await sh(sbx, get)).text == "502"  # unreachable proxy: a clear error, no hang
    Runtime(egress_settings).open()  # a restarted server re-attaches, and restarts egress with it
    assert (await sh(sbx, get)).text == "200"


async def test_daemon_exits_with_the_last_egress_sandbox(egress_runtime, egress_settings):
    from sandhold.runtime.spec import SandboxSpec

    d = egress_settings.data_dir
    # Every other egress test kills its sandboxes when it ends: one still alive is a leak.
    others = [i.id for i in egress_runtime.list() if i.spec.network.mode != "none"]
    assert not others, f"egress sandboxes left alive by earlier tests: {others}"
    info = egress_runtime.create(SandboxSpec.model_validate({"network": {"mode": "open"}}))
    assert daemon_pids(d)
    egress_runtime.kill(info.id)
    await asyncio.sleep(0.3)
    assert not daemon_pids(d)
    assert not (d / "egress" / "control.sock").exists()


async def test_a_refusal_inside_an_intercepted_tunnel_is_audited(egress_sandbox, egress_settings):
    sbx = await egress_sandbox(allow=["api.example.test"])
    r = await sh(
        sbx,
        "curl -s -o /dev/null -w '%{http_code}' --max-time 10 "
        "-H 'Host: other.example.test' 'https://api.example.test/fronted?q=1'",
    )
    assert r.text == "403"
    recs = audit.query(audit.egress_dir(egress_settings.data_dir), sandbox=sbx.id)
    denied = [x for x in recs if x["kind"] == "mitm" and x["decision"] == "deny"]
    assert denied and denied[0]["rule"] == "host" and denied[0]["path"] == "/fronted?q=1", recs
    assert denied[0]["status"] == 403 and "does not match the tunnel" in denied[0]["reason"]
