"""Egress rules and the decision the proxy takes for each connection.

A policy has a mode (``none``: nothing leaves; ``allowlist``: only what a rule allows; ``open``:
everything a rule does not deny) and two rule lists. A rule is a domain (``api.example.com``),
a wildcard (``*.example.com``: any depth of subdomain, not the apex), an IP address or a CIDR.
As in E2B, an allow rule wins over a deny rule.

Whatever the rules say, addresses that are not globally routable (loopback, link-local and the
metadata address, RFC 1918, CGNAT, the benchmarking and documentation ranges, unique-local IPv6,
multicast, the host's own addresses) are never dialled,
unless the operator opened a range (``Settings.egress_open_cidrs``): the tenant's rules cannot
reach them. The host's own addresses and the fleet's (``egress_deny_cidrs``, and what
``EgressConfig`` finds: the Kubernetes API, the store, static fleet hosts) stay closed even
inside an opened range. An address is judged in every form it stands for (``forms``): without
its scope id, and as each IPv4 address it embeds (IPv4-mapped and -compatible, NAT64, 6to4,
Teredo, ISATAP), each of which must pass on its own. Domain rules are checked against the name
the client asked for *and* every address that name resolved to, and the proxy dials only an
address it checked (no DNS rebinding).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Mode = Literal["none", "allowlist", "open"]
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_LABEL = r"(?!-)[a-z0-9_-]{1,63}(?<!-)"
_DOMAIN_RE = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
MAX_RULES = 1000
ALL_TRAFFIC = ("0.0.0.0/0", "::/0")  # a rule that names every address

# Never dialled unless the operator opens a range: every range IANA's special-purpose registries
# mark as not globally reachable (node and pod networks of a fleet live in several of them:
# 100.64.0.0/10, 198.18.0.0/15). IPv6 forms that embed an IPv4 address are judged as that
# address as well (``forms``); ::ffff:0:0/96 (IPv4-mapped) only as it.
INTERNAL_NETWORKS: tuple[IPNetwork, ...] = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.2.0/24",  # documentation (TEST-NET-1)
        "192.88.99.0/24",  # 6to4 relay anycast (deprecated)
        "192.168.0.0/16",
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",  # documentation (TEST-NET-2)
        "203.0.113.0/24",  # documentation (TEST-NET-3)
        "224.0.0.0/4",
        "240.0.0.0/4",
        "::/96",  # IPv4-compatible (deprecated), with :: and ::1
        "100::/64",  # discard-only
        "2001:2::/48",  # benchmarking
        "2001:10::/28",  # ORCHID (deprecated)
        "2001:20::/28",  # ORCHIDv2
        "2001:db8::/32",  # documentation
        "3fff::/20",  # documentation
        "fc00::/7",
        "fe80::/10",
        "fec0::/10",  # site-local (deprecated)
        "ff00::/8",
        "64:ff9b::/96",  # NAT64
        "64:ff9b:1::/48",  # NAT64, local use
        "2002::/16",  # 6to4
    )
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_V4_COMPATIBLE = ipaddress.ip_network("::/96")
_V4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")


def normalize_host(host: str) -> str:
    return host.strip().rstrip(".").lower()


def parse_ip(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def unscoped(addr: IPAddress) -> IPAddress:
    """``addr`` without its scope id (``fe80::1%eth0``): a scope names a host interface, which is
    not the sandbox's to choose, and a scoped address compares unequal to the plain one."""
    if isinstance(addr, ipaddress.IPv6Address) and addr.scope_id is not None:
        return ipaddress.IPv6Address(int(addr))
    return addr


def unmap(addr: IPAddress) -> IPAddress:
    addr = unscoped(addr)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def embedded_ipv4(addr: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address stands for, where a host's tunnel or a gateway on the
    path would deliver it as IPv4: NAT64, IPv4-compatible and -translated (the low 32 bits),
    6to4, Teredo (server and client) and ISATAP interface identifiers."""
    low = ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    out: list[ipaddress.IPv4Address] = []
    if addr in _NAT64 or addr in _V4_COMPATIBLE or addr in _V4_TRANSLATED:
        out.append(low)
    if addr.sixtofour is not None:
        out.append(addr.sixtofour)
    if addr.teredo is not None:
        out.extend(addr.teredo)
    if (int(addr) >> 32) & 0xFDFFFFFF == 0x5EFE:  # ISATAP: ::0:5efe:a.b.c.d, ::200:5efe:...
        out.append(low)
    return out


def forms(addr: IPAddress) -> list[IPAddress]:
    """Every address ``addr`` stands for: itself without a scope id, then the IPv4 addresses it
    embeds. An IPv4-mapped address is exactly its IPv4 address."""
    addr = unmap(addr)
    if isinstance(addr, ipaddress.IPv4Address):
        return [addr]
    return [addr, *embedded_ipv4(addr)]


@dataclass(frozen=True)
class Rule:
    """One parsed rule; ``text`` is how it was written (what error messages and the audit log
    name)."""

    text: str
    domain: str | None = None  # exact name
    suffix: str | None = None  # wildcard: ".example.com"
    network: IPNetwork | None = None

    def matches_name(self, name: str) -> bool:
        if self.domain is not None:
            return name == self.domain
        return self.suffix is not None and name.endswith(self.suffix)

    def matches_addr(self, addr: IPAddress, any_form: bool = False) -> bool:
        """Whether the rule's network holds ``addr`` (IPv4-mapped: its IPv4 address), or with
        ``any_form`` any address it embeds: deny rules match wider, allow rules never do."""
        net = self.network
        if net is None:
            return False
        cands = forms(addr) if any_form else [unmap(addr)]
        return any(f.version == net.version and f in net for f in cands)


def parse_rule(text: str) -> Rule:
    """A rule from its text; ValueError with a message that says what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("an egress rule must be a non-empty string")
    raw = text.strip()
    lowered = raw.lower()
    if "://" in raw:
        raise ValueError(
            f"egress rule {raw!r} must be a domain, *.domain, IP or CIDR (no scheme or port)"
        )
    if "/" in raw or parse_ip(raw) is not None:
        try:
            net = ipaddress.ip_network(raw.strip("[]"), strict=False)
        except ValueError:
            raise ValueError(f"egress rule {raw!r} is not a valid IP address or CIDR") from None
        return Rule(raw, network=net)
    if ":" in raw:
        raise ValueError(
            f"egress rule {raw!r} must be a domain, *.domain, IP or CIDR (no scheme or port)"
        )
    name = lowered.rstrip(".")
    if name.startswith("*."):
        rest = name[2:]
        if not _DOMAIN_RE.match(rest):
            raise ValueError(f"egress rule {raw!r} is not a valid wildcard domain")
        return Rule(raw, suffix="." + rest)
    if name == "*":
        raise ValueError("egress rule '*' is not valid: use mode 'open' (or 0.0.0.0/0 and ::/0)")
    if not _DOMAIN_RE.match(name) or len(name) > 253:
        raise ValueError(f"egress rule {raw!r} is not a valid domain name")
    return Rule(raw, domain=name)


def host_matches(patterns: list[str], host: str) -> bool:
    """Whether ``host`` is a name one of the rules ``patterns`` names."""
    host = host.rstrip(".").lower()
    return any(parse_rule(p).matches_name(host) for p in patterns)


def _check_rules(values: list[str]) -> list[str]:
    if len(values) > MAX_RULES:
        raise ValueError(f"at most {MAX_RULES} egress rules are allowed, got {len(values)}")
    for v in values:
        parse_rule(v)
    return [v.strip() for v in values]


class EgressPolicy(BaseModel):
    """What a sandbox may reach. Set by the operator or the tenant's control plane (the E2B
    server maps ``allow_internet_access`` and ``network.allowOut``/``denyOut`` to it), never by
    code inside the sandbox."""

    model_config = ConfigDict(extra="forbid")

    mode: Mode = "none"
    allow: list[str] = Field(default_factory=list, description="domains, *.domains, IPs, CIDRs")
    deny: list[str] = Field(default_factory=list, description="domains, *.domains, IPs, CIDRs")

    @field_validator("allow", "deny")
    @classmethod
    def _rules(cls, v: list[str]) -> list[str]:
        return _check_rules(v)


@dataclass(frozen=True)
class Decision:
    allowed: bool
    rule: str  # the rule (or built-in reason) that decided
    reason: str = ""

    def describe(self) -> str:
        verdict = "allowed" if self.allowed else "blocked"
        return f"{verdict} by {self.rule}" + (f": {self.reason}" if self.reason else "")


class Guard:
    """The always-on part: addresses no tenant rule may reach."""

    def __init__(
        self,
        open_cidrs: Iterable[str] = (),
        host_addresses: Iterable[str] = (),
        deny_cidrs: Iterable[str] = (),
    ) -> None:
        self.open = [ipaddress.ip_network(c, strict=False) for c in open_cidrs]
        self.fleet = [ipaddress.ip_network(c, strict=False) for c in deny_cidrs]
        self.host_addresses: set[IPAddress] = set()
        self.set_host_addresses(host_addresses)

    def set_host_addresses(self, addresses: Iterable[str]) -> None:
        self.host_addresses = {unmap(ipaddress.ip_address(a)) for a in addresses}

    def internal(self, addr: IPAddress) -> str | None:
        """Why ``addr`` may not be dialled, or None. Each of its forms must pass on its own, so
        opening NAT64 or 6to4 does not open the internal addresses they embed."""
        first, *embedded = forms(addr)
        why = self._judge(first)
        if why is not None:
            return why
        for v4 in embedded:
            why = self._judge(v4)
            if why is not None:
                return f"it embeds {v4}, {why}"
        return None

    def _judge(self, addr: IPAddress) -> str | None:
        if addr in self.host_addresses:  # even inside a range the operator opened
            return "an address of the sandbox host"
        for net in self.fleet:  # so are the fleet's own (egress_deny_cidrs)
            if addr.version == net.version and addr in net:
                return f"an address of the fleet ({net})"
        if any(addr.version == n.version and addr in n for n in self.open):
            return None
        for net in INTERNAL_NETWORKS:
            if addr.version == net.version and addr in net:
                return f"an internal address ({net})"
        return None


class CompiledPolicy:
    def __init__(self, policy: EgressPolicy) -> None:
        self.policy = policy
        self.allow = [parse_rule(r) for r in policy.allow]
        self.deny = [parse_rule(r) for r in policy.deny]
        self.allow_nets = [r for r in self.allow if r.network is not None]

    @property
    def mode(self) -> Mode:
        return self.policy.mode

    def _first(
        self, rules: Sequence[Rule], name: str | None, addrs: Sequence[IPAddress]
    ) -> Rule | None:
        for r in rules:
            if name is not None and r.matches_name(name):
                return r
            if addrs and r.network is not None and all(r.matches_addr(a) for a in addrs):
                return r
        return None

    def precheck(self, host: str) -> Decision | None:
        """Decide before resolving, where the name alone settles it: a denied name is never
        looked up (no DNS exfiltration through the host's resolver). None: resolve and call
        ``decide``."""
        if self.mode == "none":
            return Decision(False, "mode none", "this sandbox has no network access")
        name = None if parse_ip(host) else normalize_host(host)
        if name is not None:
            if self._first(self.allow, name, ()) is not None:
                return None
            denied = self._first(self.deny, name, ())
            if denied is not None:
                return Decision(False, f"deny {denied.text}", f"{name} is denied")
            if self.mode == "allowlist" and not self.allow_nets:
                return Decision(False, "allowlist", f"{name} is not in the allow list")
        return None

    def decide(self, host: str, addrs: Sequence[IPAddress], guard: Guard) -> Decision:
        """The verdict for connecting to ``host`` at ``addrs`` (what it resolved to; every one
        of them must pass, as the proxy may dial any)."""
        pre = self.precheck(host)
        if pre is not None:
            return pre
        if not addrs:
            return Decision(False, "resolve", f"{host} has no address")
        for a in addrs:
            why = guard.internal(a)
            if why is not None:
                return Decision(False, "internal", f"{host} resolves to {unmap(a)}, {why}")
        name = None if parse_ip(host) else normalize_host(host)
        allowed = self._first(self.allow, name, addrs)
        if allowed is not None:
            return Decision(True, f"allow {allowed.text}")
        denied = self._first(self.deny, name, ())
        if denied is None:
            denied = next(
                (r for r in self.deny if any(r.matches_addr(a, True) for a in addrs)), None
            )
        if denied is not None:
            return Decision(False, f"deny {denied.text}", f"{host} is denied")
        if self.mode == "open":
            return Decision(True, "mode open")
        return Decision(False, "allowlist", f"{host} is not in the allow list")

    def name_allowed(self, name: str) -> bool:
        """For DNS answers: may this name be looked up at all?"""
        return self.precheck(name) is None
