"""Rule parsing and decisions of the egress policy (pure functions, no network)."""

from __future__ import annotations

import ipaddress

import pytest
from pydantic import ValidationError

from sandhold.egress.policy import CompiledPolicy, EgressPolicy, Guard, parse_rule

A = ipaddress.ip_address
GUARD = Guard(host_addresses=["203.0.113.7"])


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
    assert decide("a.test", ["198.51.100.1"], mode="allowlist", allow=["a.test"]) == (
        True,
        "allow a.test",
    )
    assert decide("b.test", ["198.51.100.1"], mode="allowlist", allow=["a.test"])[0] is False
    # allow wins over deny, as in E2B
    assert (
        decide("a.test", ["198.51.100.1"], mode="open", allow=["a.test"], deny=["198.51.100.0/24"])[
            0
        ]
        is True
    )
    assert decide("c.test", ["198.51.100.1"], mode="open", deny=["198.51.100.0/24"]) == (
        False,
        "deny 198.51.100.0/24",
    )
    assert decide("c.test", ["198.51.100.9"], mode="none")[1] == "mode none"


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
        "203.0.113.7",
        "0.0.0.0",
        "224.0.0.1",
    ],
)
def test_internal_addresses_are_denied_whatever_the_rules(addr: str) -> None:
    allowed, rule = decide("x.test", [addr], mode="open", allow=["x.test", "0.0.0.0/0", "::/0"])
    assert (allowed, rule) == (False, "internal")


def test_one_internal_address_among_several_denies_the_name() -> None:
    assert decide("x.test", ["198.51.100.1", "127.0.0.1"], mode="open") == (False, "internal")


def test_the_operator_can_open_an_internal_range() -> None:
    guard = Guard(open_cidrs=["10.9.0.0/16"])
    policy = CompiledPolicy(EgressPolicy(mode="allowlist", allow=["10.9.1.2"]))
    assert policy.decide("10.9.1.2", [A("10.9.1.2")], guard).allowed
    assert not policy.decide("10.8.1.2", [A("10.8.1.2")], guard).allowed


def test_names_outside_an_allow_list_are_refused_before_any_lookup() -> None:
    p = CompiledPolicy(EgressPolicy(mode="allowlist", allow=["a.test"]))
    assert p.precheck("exfil.evil.test") is not None
    assert p.precheck("a.test") is None
    # with an address rule a name may still turn out allowed: resolve first
    assert (
        CompiledPolicy(EgressPolicy(mode="allowlist", allow=["198.51.100.0/24"])).precheck("b.test")
        is None
    )
