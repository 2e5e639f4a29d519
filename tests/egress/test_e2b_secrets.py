"""E2B's secrets and header rules, driven by the official SDK's ``Secret`` client and
``network.rules`` against a real `sandhold serve` whose egress proxy uses the test internet: a
team's secret reaches the host a rule names, resolved at each request, and never the sandbox."""

from __future__ import annotations

import hashlib
import json

import pytest
from e2b import AsyncSecret, Sandbox, SandboxException, Secret
from e2b.exceptions import SecretException, SecretNotFoundException
from e2b.sandbox.network import ALL_TRAFFIC

from tests.egress.test_e2b_egress import TOKEN, egress_server  # noqa: F401  (the module's server)
from tests.support.e2b_server import KEY_B, Server

AUTH = "curl -sS --max-time 10 {scheme}://api.example.test/auth"
ALLOW = ["api.example.test", "other.example.test"]


def sha(text: str) -> str:
    return "auth-sha256=" + hashlib.sha256(text.encode()).hexdigest()


def net(rules: dict[str, object] | None) -> dict[str, object]:
    out: dict[str, object] = {"allow_out": ALLOW, "deny_out": [ALL_TRAFFIC]}
    return out if rules is None else {**out, "rules": rules}


def rule(headers: dict[str, str]) -> list[dict[str, object]]:
    return [{"transform": {"headers": headers}}]


def test_the_secret_client_keeps_values_write_only(egress_server: Server) -> None:  # noqa: F811
    made = Secret.create("Deploy-Key", "value-one-6b1f", metadata={"owner": "ops"})
    try:
        assert made.name == "deploy-key" and made.version == 1 and made.secret_id.startswith("sec_")
        assert Secret.get_info(made.secret_id).metadata == {"owner": "ops"}
        assert Secret.get_info("DEPLOY-KEY").secret_id == made.secret_id
        with pytest.raises(SecretException, match="already exists"):
            Secret.create("deploy-key", "other")
        updated = Secret.update("deploy-key", "value-two-7c2e")
        assert updated.version == 2 and updated.metadata == {"owner": "ops"}  # kept: not given
        updated = Secret.update(made.secret_id, "value-three-8d3f", metadata={})
        assert updated.version == 3 and updated.metadata == {}
        other = Secret.create("second", "value-2nd-9e4a")
        pages = Secret.list(limit=1)
        first = pages.next_items()
        assert len(first) == 1 and pages.has_next
        assert {s.name for s in first + pages.next_items()} == {"deploy-key", "second"}
        assert Secret.destroy(other.secret_id) is True and Secret.destroy(other.secret_id) is False
        with pytest.raises(SecretNotFoundException):
            Secret.get_info("second")
        # No answer carries a value, and another team sees nothing of it.
        with egress_server.api() as api:
            raw = api.get("/secrets").text + api.get(f"/secrets/{made.secret_id}").text
        assert "value-" not in raw and json.loads(raw[: raw.index("]") + 1])[0]["name"]
        with pytest.raises(SecretNotFoundException):
            Secret.get_info(made.secret_id, api_key=KEY_B)
        assert Secret.list(api_key=KEY_B).next_items() == []
        assert Secret.destroy("deploy-key", api_key=KEY_B) is False
    finally:
        Secret.destroy("deploy-key")


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        ("bad name", "v", "secret name"),
        ("sec_reserved", "v", "must not start with 'sec_'"),
        ("ok", "", "1-16384 characters"),
        ("ok", "line\nbreak", "CR, LF or NUL"),
    ],
)
def test_bad_secrets_are_refused_and_change_nothing(egress_server, name, value, match) -> None:  # noqa: F811
    with pytest.raises(SecretException, match=match):
        Secret.create(name, value)
    assert Secret.list().next_items() == []


async def test_the_async_secret_client(egress_server: Server) -> None:  # noqa: F811
    made = await AsyncSecret.create("async-key", "value-async-0f5b")
    try:
        assert (await AsyncSecret.get_info("async-key")).secret_id == made.secret_id
        assert (await AsyncSecret.update("async-key", "value-async-1a6c")).version == 2
    finally:
        assert await AsyncSecret.destroy("async-key") is True


def test_header_rules_inject_the_current_secret_over_tls_only(egress_server: Server) -> None:  # noqa: F811
    Secret.create("api-token", "rule-token-v1-2b7d")
    auth = f"Bearer {Secret.fill('api-token')}"
    sbx = Sandbox.create(
        timeout=120,
        network={
            "allow_out": ALLOW,
            "deny_out": [ALL_TRAFFIC],
            "rules": {
                "api.example.test": rule({"Authorization": auth}),
                "other.example.test": rule({"X-Team": "blue"}),
            },
        },
    )
    try:
        # The rule wins over the team's native secret for the same host and header.
        assert sbx.commands.run(AUTH.format(scheme="https")).stdout == sha(
            "Bearer rule-token-v1-2b7d"
        )
        Secret.update("api-token", "rule-token-v2-3c8e")  # resolved per request: applies at once
        assert sbx.commands.run(AUTH.format(scheme="https")).stdout == sha(
            "Bearer rule-token-v2-3c8e"
        )
        # Over plain HTTP a secret never goes (nor the native one); a plain header does.
        assert (
            sbx.commands.run(AUTH.format(scheme="http")).stdout
            == "auth-sha256=" + hashlib.sha256(b"").hexdigest()
        )
        echoed = sbx.commands.run("curl -sS --max-time 10 http://other.example.test/echo-headers")
        assert "X-Team: blue" in echoed.stdout
        # Reflected back, the value is blanked; the sandbox holds it nowhere.
        reflected = sbx.commands.run(
            "curl -sS -i --max-time 10 https://api.example.test/echo-headers"
        )
        assert "rule-token" not in reflected.stdout
        assert "\nAuthorization: Bearer " + "*" * len("rule-token-v2-3c8e") in reflected.stdout
        assert "rule-token" not in sbx.commands.run("env; cat /etc/hosts").stdout
        info = sbx.get_info().network
        assert info and "rule-token" not in json.dumps(info, default=str)

        # PUT /network replaces the rules; left out, they are gone.
        sbx.update_network(net({"api.example.test": rule({"Authorization": "Token fixed"})}))
        assert sbx.commands.run(AUTH.format(scheme="https")).stdout == sha("Token fixed")
        sbx.update_network(net(None))
        assert sbx.commands.run(AUTH.format(scheme="https")).stdout == sha(f"Bearer {TOKEN}")

        # A secret deleted under a rule refuses the request rather than send it without.
        sbx.update_network(net({"api.example.test": rule({"Authorization": auth})}))
        Secret.destroy("api-token")
        code = "curl -s -o /dev/null -w '%{http_code}' --max-time 10 https://api.example.test/auth"
        assert sbx.commands.run(code).stdout == "502"
    finally:
        sbx.kill()
        Secret.destroy("api-token")


@pytest.mark.parametrize(
    ("rules", "match"),
    [
        (
            {"api.example.test": rule({"Authorization": "Bearer ${e2b.secrets.nope}"})},
            "'nope' does not exist",
        ),
        ({"10.0.0.1": rule({"X": "y"})}, "is an address"),
        ({"api.example.test": rule({"Host": "x"})}, "not a header"),
        ({"api.example.test": rule({"X": "${e2b.identity.tokens.aws}"})}, "workload identity"),
        ({"http://x": rule({"X": "y"})}, "no scheme"),
    ],
)
def test_bad_rules_are_refused_and_leave_no_sandbox(egress_server, rules, match) -> None:  # noqa: F811
    before = {s.sandbox_id for s in Sandbox.list().next_items()}
    with pytest.raises(SandboxException, match=match):
        Sandbox.create(timeout=60, network={"allow_out": ALLOW, "rules": rules})
    assert {s.sandbox_id for s in Sandbox.list().next_items()} == before


def test_rules_with_a_secrets_scope_are_refused(egress_server: Server) -> None:  # noqa: F811
    with pytest.raises(SandboxException, match="cannot be combined"):
        Sandbox.create(timeout=60, metadata={"sandhold.secrets-scope": "acme"},
                       network=net({"api.example.test": rule({"X": "y"})}))  # fmt: skip


def test_a_transform_other_than_headers_is_refused(egress_server: Server) -> None:  # noqa: F811
    """The SDK sends only headers; a raw client may send more, which is refused, not dropped."""
    body = {"templateID": "base", "network": {"allowOut": ALLOW, "rules": {
        "api.example.test": [{"transform": {"headers": {"X": "y"}, "body": "x"}}]}}}  # fmt: skip
    with egress_server.api() as api:
        r = api.post("/sandboxes", json=body)
        assert r.status_code == 400 and "only 'headers'" in r.json()["message"], r.text
        assert api.get("/v2/sandboxes").json() == []
