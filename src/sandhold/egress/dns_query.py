"""``POST /dns-query``: a DNS question (RFC 8484 message) relayed by the agent's DNS stub, which
the proxy answers itself under the sandbox's policy (``dns`` is the wire format)."""

from __future__ import annotations

import ipaddress
from typing import Any

import h11

from sandhold.egress import dns
from sandhold.egress.connection import Connection
from sandhold.egress.refusal import refused
from sandhold.errors import EgressRefused, InvalidRequest


async def dns_query(c: Connection, conn: h11.Connection) -> None:
    body = b""
    while True:
        ev = await c.event(conn, c.reader)
        if isinstance(ev, h11.Data):
            body += ev.data
            if len(body) > dns.MAX_MESSAGE:
                raise refused(400, "DNS message too long", "protocol")
        elif isinstance(ev, h11.EndOfMessage):
            break
        else:
            return
    reply = await answer_dns(c, body)
    head = conn.send(
        h11.Response(
            status_code=200,
            headers=[
                ("Content-Type", "application/dns-message"),
                ("Content-Length", str(len(reply))),
                ("Connection", "close"),
            ],
        )
    )
    c.writer.write((head or b"") + (conn.send(h11.Data(data=reply)) or b""))
    await c.writer.drain()


async def answer_dns(c: Connection, msg: bytes) -> bytes:
    try:
        q = dns.parse_query(msg)
    except InvalidRequest:  # not a DNS message we can parse
        return dns.error_reply(msg, dns.RCODE_FORMERR)
    rec: dict[str, Any] = {"kind": "dns", "host": q.name, "method": str(q.qtype)}
    if q.qclass != dns.CLASS_IN or not q.name or not c.sbx.policy.name_allowed(q.name):
        pre = c.sbx.policy.precheck(q.name)
        c.record(
            **rec,
            status=dns.RCODE_NXDOMAIN,
            decision="deny",
            rule=pre.rule if pre else "dns",
            reason="name not allowed",
        )
        return dns.answer(q, dns.RCODE_NXDOMAIN)
    if q.qtype not in (dns.TYPE_A, dns.TYPE_AAAA):
        # Only addresses are ever looked up: no TXT/MX/... question leaves the host.
        c.record(**rec, status=0, decision="allow", rule="dns", reason="no data")
        return dns.answer(q, dns.RCODE_OK)
    try:
        addrs = await c.shared.resolver.resolve(q.name)
    except EgressRefused:  # the name does not resolve
        c.record(**rec, status=dns.RCODE_NXDOMAIN, decision="allow", rule="resolve")
        return dns.answer(q, dns.RCODE_NXDOMAIN)
    ips = [ipaddress.ip_address(a) for a in addrs]
    decision = c.sbx.policy.decide(q.name, ips, c.shared.guard)
    if not decision.allowed:
        c.record(
            **rec,
            status=dns.RCODE_NXDOMAIN,
            decision="deny",
            rule=decision.rule,
            reason=decision.reason,
        )
        return dns.answer(q, dns.RCODE_NXDOMAIN)
    c.record(**rec, status=0, decision="allow", rule=decision.rule)
    return dns.answer(q, dns.RCODE_OK, addrs)
