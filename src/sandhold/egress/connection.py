"""What every path of the egress proxy works with: the sandbox a connection belongs to, the
state the daemon shares between sandboxes, and one client connection with its plumbing (audit
records, h11 reads, and resolving and dialing a target the policy checked)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import h11

from sandhold.audit import AuditLog
from sandhold.egress.ca import DeploymentCA
from sandhold.egress.header_rules import HeaderRule
from sandhold.egress.policy import (
    CompiledPolicy,
    Decision,
    Guard,
    IPAddress,
    host_matches,
    parse_ip,
    unscoped,
)
from sandhold.egress.refusal import refused
from sandhold.egress.resolver import Resolver
from sandhold.egress.secrets import Injection, SecretStore
from sandhold.errors import EgressRefused

log = logging.getLogger("sandhold.egress")

CHUNK = 65536
MAX_HEAD = 64 * 1024


@dataclass
class SandboxEgress:
    """What the daemon knows about one sandbox."""

    id: str
    policy: CompiledPolicy
    tenant: str | None = None
    session: str | None = None
    header_rules: list[HeaderRule] = field(default_factory=list)


@dataclass
class Shared:
    """State shared by every sandbox's proxy in the daemon."""

    guard: Guard
    resolver: Resolver
    audit: AuditLog
    upstream_tls: ssl.SSLContext
    ca_factory: Callable[[], DeploymentCA]
    secrets: SecretStore | None = None
    connect_timeout: float = 10.0
    idle_timeout: float = 300.0
    _ca: DeploymentCA | None = field(default=None, repr=False)

    @property
    def ca(self) -> DeploymentCA:
        if self._ca is None:
            self._ca = self.ca_factory()
        return self._ca

    def injections(self, sbx: SandboxEgress, host: str) -> list[Injection]:
        """The tenant's secrets bound to ``host``, then the sandbox's header rules for it
        (which win where both set a header)."""
        if self.secrets is None or sbx.tenant is None:
            return []
        native = self.secrets.injections(sbx.tenant, host)
        if not sbx.header_rules:
            return native
        ruled = self.secrets.rule_injections(sbx.header_rules, sbx.tenant, host)
        names = {i.header.lower() for i in ruled}
        return [i for i in native if i.header.lower() not in names] + ruled

    def intercepts(self, sbx: SandboxEgress, host: str) -> bool:
        if self.secrets is None or sbx.tenant is None or parse_ip(host) is not None:
            return False
        if any(host_matches([r.host], host) for r in sbx.header_rules):
            return True
        return any(host_matches(h, host) for h in self.secrets.hosts_of(sbx.tenant))


@dataclass
class Target:
    host: str  # as the client named it (lowercase)
    port: int
    addrs: list[IPAddress]
    decision: Decision


class Connection:
    """One client connection on a sandbox's socket."""

    def __init__(
        self,
        sbx: SandboxEgress,
        shared: Shared,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.sbx = sbx
        self.shared = shared
        self.reader = reader
        self.writer = writer

    def record(self, **rec: Any) -> None:
        rec.update(sandbox=self.sbx.id, tenant=self.sbx.tenant, session=self.sbx.session)
        try:
            self.shared.audit.write(rec)
        except OSError as e:  # the audit log must not take egress down with it
            log.error("audit log write failed: %s", e)

    async def _read(self, reader: asyncio.StreamReader, timeout: float | None = None) -> bytes:
        return await asyncio.wait_for(reader.read(CHUNK), timeout or self.shared.idle_timeout)

    async def event(self, conn: h11.Connection, reader: asyncio.StreamReader) -> Any:
        """The next h11 event of ``conn``, reading from ``reader`` as it needs."""
        while True:
            ev = conn.next_event()
            if ev is not h11.NEED_DATA:
                return ev
            conn.receive_data(await self._read(reader))

    async def resolve_target(self, host: str, port: int) -> Target:
        policy = self.sbx.policy
        pre = policy.precheck(host)
        if pre is not None:
            raise refused(403, pre.describe(), pre.rule)
        try:
            texts = await self.shared.resolver.resolve(host)
        except EgressRefused as e:  # only the resolver's: the name does not resolve
            raise refused(502, str(e), "resolve") from None
        # Judged and dialled without a scope id: the sandbox does not pick host interfaces.
        addrs = [unscoped(ipaddress.ip_address(a)) for a in texts]
        decision = policy.decide(host, addrs, self.shared.guard)
        if not decision.allowed:
            raise refused(403, decision.describe(), decision.rule)
        return Target(host, port, addrs, decision)

    async def dial(
        self, target: Target, tls: bool = False
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Connect to one of the target's checked addresses (never re-resolving its name)."""
        last: Exception | None = None
        for addr in target.addrs:
            try:
                return await asyncio.wait_for(
                    asyncio.open_connection(
                        str(addr),
                        target.port,
                        limit=CHUNK,
                        ssl=self.shared.upstream_tls if tls else None,
                        server_hostname=target.host if tls else None,
                    ),
                    self.shared.connect_timeout,
                )
            except TimeoutError:
                last = TimeoutError(f"connecting to {target.host}:{target.port} timed out")
            except ssl.SSLError as e:
                raise refused(502, f"TLS to {target.host} failed: {e.reason or e}") from None
            except OSError as e:
                last = e
        raise refused(502, f"cannot connect to {target.host}:{target.port}: {last}", "upstream")
