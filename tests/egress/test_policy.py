"""Rule parsing and decisions of the egress policy (pure functions, no network)."""

from __future__ import annotations

import ipaddress

import pytest
from pydantic import ValidationError

from sandhold.config import Settings
from sandhold.egress.config import EgressConfig
from sandhold.egress.policy import CompiledPolicy, EgressPolicy, Guard, parse_rule

A = ipaddress.ip_address
# Globally routable stand-ins (decisions only: nothing here is dialled). The documentation
# ranges are not globally routable, so the guard refuses them like any internal address.
PUBLIC = "11.0.0"  # .0/24
HOST = "11.0.1.7"
GUARD = Guard(host_addresses=[HOST])


def decide(host: str, addrs: list[str], **policy: object) -> tuple[bool, str]:
    d = CompiledPolicy(EgressPolicy.model_validate(policy)).decide(
        host, [A(a) for a in addrs], GUARD
    )
    return d.allowed, d.rule


@pytest.mark.parametrize(
    "bad",
    ["", "*", "http://a.test", "a.test:443", "bad..name", "-a.test", "1.2.3.4/33", "*.", "a b"],
)
def test_bad_rules_are_refused_with_a_reason(bad: str) -> None:
    with pytest.raises(ValueError, match=r"egress rule|not valid"):
        parse_rule(bad)
    with pytest.raises(ValidationError):
        EgressPolicy(mode="allowlist", allow=[bad])


def test_wildcards_match_subdomains_not_the_apex_or_lookalikes() -> None:
    r = parse_rule("*.Example.test")
    assert r.matches_name("a.example.test") and r.matches_name("a.b.example.test")
    assert not r.matches_name("example.test") and not r.matches_name("badexample.test")


def test_allow_list_and_deny_precedence() -> None:
    assert decide("a.test", [f"{PUBLIC}.1"], mode="allowlist", allow=["a.test"]) == (
        True,
        "allow a.test",
    )
    assert decide("b.test", [f"{PUBLIC}.1"], mode="allowlist", allow=["a.test"])[0] is False
    # allow wins over deny, as in E2B
    assert (
        decide("a.test", [f"{PUBLIC}.1"], mode="open", allow=["a.test"], deny=[f"{PUBLIC}.0/24"])[0]
        is True
    )
    assert decide("c.test", [f"{PUBLIC}.1"], mode="open", deny=[f"{PUBLIC}.0/24"]) == (
        False,
        f"deny {PUBLIC}.0/24",
    )
    assert decide("c.test", [f"{PUBLIC}.9"], mode="none")[1] == "mode none"


@pytest.mark.parametrize(
    "addr",
    [
        "127.0.0.1",
        "10.1.1.1",
        "172.20.0.1",
        "192.168.0.1",
        "169.254.169.254",
        "100.64.1.1",
        "::1",
        "fd12::1",
        "fe80::1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        HOST,
        "0.0.0.0",
        "224.0.0.1",
        # not globally routable either: where fleets put nodes, and the documentation ranges
        "198.18.0.1",
        "198.19.255.254",
        "192.0.2.1",
        "198.51.100.1",
        "203.0.113.1",
        "2001:db8::1",
        "2001:2::1",
        "100::1",
        "::ffff:198.18.0.1",
    ],
)
def test_internal_addresses_are_denied_whatever_the_rules(addr: str) -> None:
    allowed, rule = decide("x.test", [addr], mode="open", allow=["x.test", "0.0.0.0/0", "::/0"])
    assert (allowed, rule) == (False, "internal")


def test_one_internal_address_among_several_denies_the_name() -> None:
    assert decide("x.test", [f"{PUBLIC}.1", "127.0.0.1"], mode="open") == (False, "internal")


def test_the_operator_can_open_an_internal_range() -> None:
    guard = Guard(open_cidrs=["10.9.0.0/16"])
    policy = CompiledPolicy(EgressPolicy(mode="allowlist", allow=["10.9.1.2"]))
    assert policy.decide("10.9.1.2", [A("10.9.1.2")], guard).allowed
    assert not policy.decide("10.8.1.2", [A("10.8.1.2")], guard).allowed


def test_the_fleets_addresses_stay_closed_inside_an_opened_range() -> None:
    guard = Guard(open_cidrs=["10.9.0.0/16"], deny_cidrs=["10.9.1.0/24", f"{PUBLIC}.7/32"])
    policy = CompiledPolicy(EgressPolicy(mode="open"))
    assert policy.decide("10.9.2.2", [A("10.9.2.2")], guard).allowed  # opened
    for addr in ("10.9.1.2", f"{PUBLIC}.7", "::ffff:10.9.1.2"):  # the fleet's, in any form
        got = policy.decide(addr, [A(addr)], guard)
        assert not got.allowed and "an address of the fleet" in got.describe(), addr
    assert policy.decide(f"{PUBLIC}.8", [A(f"{PUBLIC}.8")], guard).allowed


def test_a_host_finds_the_fleets_addresses_it_knows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    s = Settings(
        snapshot_s3_endpoint_url="http://203.0.113.9:9000",
        fleet_hosts=["http://[2001:db8::5]:49982", "http://198.51.100.4:49982"],
        egress_deny_cidrs=["10.0.0.0/16"],
    )
    assert EgressConfig.from_settings(s).deny_cidrs == [
        "10.0.0.0/16",
        "10.96.0.1/32",
        "198.51.100.4/32",
        "2001:db8::5/128",
        "203.0.113.9/32",
    ]


def test_names_outside_an_allow_list_are_refused_before_any_lookup() -> None:
    p = CompiledPolicy(EgressPolicy(mode="allowlist", allow=["a.test"]))
    assert p.precheck("exfil.evil.test") is not None
    assert p.precheck("a.test") is None
    # with an address rule a name may still turn out allowed: resolve first
    assert (
        CompiledPolicy(EgressPolicy(mode="allowlist", allow=[f"{PUBLIC}.0/24"])).precheck("b.test")
        is None
    )


@pytest.mark.parametrize(
    "addr,embedded",
    [
        ("::ffff:127.0.0.1", None),  # IPv4-mapped: exactly its IPv4 address
        ("::127.0.0.1", "127.0.0.1"),  # IPv4-compatible
        ("::ffff:0:10.0.0.1", "10.0.0.1"),  # IPv4-translated
        ("64:ff9b::a9fe:a9fe", "169.254.169.254"),  # NAT64
        ("2002:c0a8:101::1", "192.168.1.1"),  # 6to4
        ("2001:0:b00:1::80ff:fffe", "127.0.0.1"),  # Teredo (client, xor 0xffffffff)
        ("2001:0:a00:1::", "10.0.0.1"),  # Teredo (server)
        ("2001:4860::200:5efe:a00:1", "10.0.0.1"),  # ISATAP
    ],
)
def test_ipv6_forms_are_judged_by_the_ipv4_address_they_embed(addr, embedded) -> None:
    opened = Guard(open_cidrs=["64:ff9b::/96", "2002::/16", "::/96", "::ffff:0:0:0/96"])
    why = opened.internal(A(addr))
    assert why is not None and "internal address" in why
    if embedded:
        assert f"embeds {embedded}" in why
    # and the operator must open the embedded range as well
    both = Guard(open_cidrs=[*(str(n) for n in opened.open), "0.0.0.0/0"])
    assert both.internal(A(addr)) is None


def test_public_ipv4_behind_nat64_passes_once_the_operator_opens_it() -> None:
    assert GUARD.internal(A("64:ff9b::8.8.8.8")) is not None  # closed by default
    assert Guard(open_cidrs=["64:ff9b::/96"]).internal(A("64:ff9b::8.8.8.8")) is None
    assert GUARD.internal(A("2001:0:4136:e378:8000:63bf:f4ff:fffe")) is None  # Teredo of 11.0.0.1


@pytest.mark.parametrize(
    "addr",
    ["2001:4860::7%eth0", "2001:4860::7%25lo", f"::ffff:{HOST}%lo", f"64:ff9b::{HOST}"],
)
def test_scope_ids_and_embedded_forms_of_host_addresses(addr: str) -> None:
    guard = Guard(open_cidrs=["64:ff9b::/96"], host_addresses=[HOST, "2001:4860::7"])
    assert "an address of the sandbox host" in (guard.internal(A(addr)) or "")
    d = CompiledPolicy(EgressPolicy(mode="open")).decide("x.test", [A(addr)], guard)
    assert (d.allowed, d.rule) == (False, "internal")


def test_deny_rules_match_embedded_forms_and_allow_rules_do_not() -> None:
    guard = Guard(open_cidrs=["64:ff9b::/96"])
    deny = CompiledPolicy(EgressPolicy(mode="open", deny=[f"{PUBLIC}.0/24"]))
    assert not deny.decide("x.test", [A(f"64:ff9b::{PUBLIC}.1")], guard).allowed
    allow = CompiledPolicy(EgressPolicy(mode="allowlist", allow=[f"{PUBLIC}.0/24"]))
    assert not allow.decide(f"64:ff9b::{PUBLIC}.1", [A(f"64:ff9b::{PUBLIC}.1")], guard).allowed
    assert allow.decide(f"::ffff:{PUBLIC}.1", [A(f"::ffff:{PUBLIC}.1")], guard).allowed
