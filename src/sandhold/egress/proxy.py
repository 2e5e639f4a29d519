"""One sandbox's egress proxy: what the daemon runs for each connection on a sandbox's socket.

The socket identifies the sandbox (it is bind-mounted into that sandbox only), so nothing the
sandbox sends can claim another identity. A connection carries one of:

- ``CONNECT host:port``: a tunnel. Hosts with a credential-injection rule are intercepted (TLS
  terminated with the deployment CA, each request checked and given the credential, then sent
  upstream over verified TLS); any other host is spliced through untouched, after the TLS
  ClientHello's SNI (if any) was checked against the CONNECT host.
- ``GET http://host/...`` (absolute form): plain HTTP, forwarded one request per upstream
  connection, re-framed by h11 (so no smuggling: one framing in, one framing out).
- ``POST /dns-query``: a DNS question (RFC 8484 message), relayed by the agent's DNS stub.

Every decision is the policy's (``policy.CompiledPolicy``) on the name asked for and on every
address it resolved to; the proxy dials only an address it checked. Denials are immediate 403s
that name the rule.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import h11

from sandhold.audit import AuditLog
from sandhold.egress import dns
from sandhold.egress.ca import DeploymentCA
from sandhold.egress.policy import CompiledPolicy, Decision, Guard, IPAddress, parse_ip
from sandhold.egress.resolver import Resolver
from sandhold.egress.secrets import Injection, SecretKeyError, SecretStore, host_matches
from sandhold.errors import EgressRefused, InvalidRequest

log = logging.getLogger("sandhold.egress")

CHUNK = 65536
MAX_HEAD = 64 * 1024
CLIENT_HELLO_MAX = 16 * 1024
HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"proxy-authorization",
    b"proxy-authenticate",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
    b"expect",
    b"content-length",
}


@dataclass
class SandboxEgress:
    """What the daemon knows about one sandbox."""

    id: str
    policy: CompiledPolicy
    tenant: str | None = None
    session: str | None = None


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
        if self.secrets is None or sbx.tenant is None:
            return []
        return self.secrets.injections(sbx.tenant, host)

    def intercepts(self, sbx: SandboxEgress, host: str) -> bool:
        if self.secrets is None or sbx.tenant is None or parse_ip(host) is not None:
            return False
        return any(host_matches(h, host) for h in self.secrets.hosts_of(sbx.tenant))


class Refused(Exception):
    """Answer the client with ``status`` and a plain reason, and record it."""

    def __init__(self, status: int, reason: str, rule: str = "") -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.rule = rule


@dataclass
class Target:
    host: str  # as the client named it (lowercase)
    port: int
    addrs: list[IPAddress]
    decision: Decision


class Redactor:
    """Blanks the bare secret values out of a response stream (same length, so framing and
    Content-Length stay right), keeping a tail back in case a value spans two chunks."""

    def __init__(self, values: list[bytes]) -> None:
        self.values = [v for v in values if len(v) >= 4]
        self.keep = max((len(v) for v in self.values), default=1) - 1
        self.buf = b""

    def feed(self, data: bytes) -> bytes:
        if not self.values:
            return data
        buf = self.buf + data
        for v in self.values:
            buf = buf.replace(v, b"*" * len(v))
        cut = max(len(buf) - self.keep, 0)
        self.buf = buf[cut:]
        return buf[:cut]

    def flush(self) -> bytes:
        out, self.buf = self.buf, b""
        return out


def _reply(status: int, reason: str, rule: str = "") -> bytes:
    body = f"sandhold egress proxy: {reason}\n".encode()
    head = [
        f"HTTP/1.1 {status} {_phrase(status)}",
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Connection: close",
        "X-Sandhold-Egress: denied" if status == 403 else "X-Sandhold-Egress: error",
    ]
    if rule:
        head.append("X-Sandhold-Egress-Rule: " + rule.replace("\r", "").replace("\n", ""))
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _phrase(status: int) -> str:
    return {
        400: "Bad Request",
        403: "Forbidden",
        405: "Method Not Allowed",
        502: "Bad Gateway",
        504: "Gateway Timeout",
    }.get(status, "Error")


def _authority(text: str, default_port: int | None) -> tuple[str, int]:
    host, port = text, default_port
    if text.startswith("["):
        end = text.find("]")
        host, rest = text[1:end], text[end + 1 :]
        if rest.startswith(":"):
            port = int(rest[1:]) if rest[1:].isdigit() else -1
    elif text.count(":") == 1:
        host, _, p = text.partition(":")
        port = int(p) if p.isdigit() else -1
    if not host or port is None or not 0 < port < 65536:
        raise Refused(400, f"invalid host or port {text!r}")
    return host.rstrip(".").lower(), port


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

    # -- plumbing -----------------------------------------------------------------------------
    def record(self, **rec: Any) -> None:
        rec.update(sandbox=self.sbx.id, tenant=self.sbx.tenant, session=self.sbx.session)
        try:
            self.shared.audit.write(rec)
        except OSError as e:  # the audit log must not take egress down with it
            log.error("audit log write failed: %s", e)

    async def _read(self, reader: asyncio.StreamReader, timeout: float | None = None) -> bytes:
        return await asyncio.wait_for(reader.read(CHUNK), timeout or self.shared.idle_timeout)

    async def _event(self, conn: h11.Connection, reader: asyncio.StreamReader) -> Any:
        while True:
            ev = conn.next_event()
            if ev is not h11.NEED_DATA:
                return ev
            conn.receive_data(await self._read(reader))

    async def resolve_target(self, host: str, port: int) -> Target:
        policy = self.sbx.policy
        pre = policy.precheck(host)
        if pre is not None:
            raise Refused(403, pre.describe(), pre.rule)
        try:
            texts = await self.shared.resolver.resolve(host)
        except EgressRefused as e:  # only the resolver's: the name does not resolve
            raise Refused(502, str(e), "resolve") from None
        addrs = [ipaddress.ip_address(a) for a in texts]
        decision = policy.decide(host, addrs, self.shared.guard)
        if not decision.allowed:
            raise Refused(403, decision.describe(), decision.rule)
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
                raise Refused(502, f"TLS to {target.host} failed: {e.reason or e}") from None
            except OSError as e:
                last = e
        raise Refused(502, f"cannot connect to {target.host}:{target.port}: {last}", "upstream")

    # -- entry --------------------------------------------------------------------------------
    async def run(self) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        started = time.monotonic()
        req: h11.Request | None = None
        try:
            ev = await self._event(conn, self.reader)
            if not isinstance(ev, h11.Request):
                return
            req = ev
            method = req.method.decode()
            target = req.target.decode("ascii", "replace")
            if method == "CONNECT":
                await self.tunnel(conn, target, started)
            elif target.startswith("http://") or target.startswith("https://"):
                await self.forward_plain(conn, req, started)
            elif method == "POST" and target.split("?")[0] == "/dns-query":
                await self.dns_query(conn)
            else:
                raise Refused(
                    400,
                    "this is the sandbox's egress proxy: use it as HTTP_PROXY "
                    "(absolute URLs or CONNECT)",
                    "protocol",
                )
        except Refused as e:
            self._refuse(e, req, started)
        except h11.RemoteProtocolError as e:
            self._refuse(Refused(400, f"malformed request: {e}", "protocol"), req, started)
        except (TimeoutError, ConnectionError, OSError, ssl.SSLError):
            pass
        finally:
            self.writer.close()

    def _refuse(self, e: Refused, req: h11.Request | None, started: float) -> None:
        try:
            self.writer.write(_reply(e.status, e.reason, e.rule))
        except (ConnectionError, RuntimeError):
            pass
        method = req.method.decode() if req else None
        host = path = None
        port = None
        if req is not None:
            t = req.target.decode("ascii", "replace")
            if method == "CONNECT":
                path = t
                try:
                    host, port = _authority(t, None)
                except Refused:
                    pass
            else:
                parts = urlsplit(t)
                host, path = parts.hostname, parts.path or t
        self.record(
            kind="connect" if method == "CONNECT" else "http",
            method=method,
            host=host,
            port=port,
            path=path,
            status=e.status,
            decision="deny",
            rule=e.rule,
            reason=e.reason,
            duration_ms=round((time.monotonic() - started) * 1e3, 2),
        )

    # -- DNS ----------------------------------------------------------------------------------
    async def dns_query(self, conn: h11.Connection) -> None:
        body = b""
        while True:
            ev = await self._event(conn, self.reader)
            if isinstance(ev, h11.Data):
                body += ev.data
                if len(body) > dns.MAX_MESSAGE:
                    raise Refused(400, "DNS message too long", "protocol")
            elif isinstance(ev, h11.EndOfMessage):
                break
            else:
                return
        reply = await self.answer_dns(body)
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
        self.writer.write((head or b"") + (conn.send(h11.Data(data=reply)) or b""))
        await self.writer.drain()

    async def answer_dns(self, msg: bytes) -> bytes:
        try:
            q = dns.parse_query(msg)
        except InvalidRequest:  # not a DNS message we can parse
            return dns.error_reply(msg, dns.RCODE_FORMERR)
        rec: dict[str, Any] = {"kind": "dns", "host": q.name, "method": str(q.qtype)}
        if q.qclass != dns.CLASS_IN or not q.name or not self.sbx.policy.name_allowed(q.name):
            pre = self.sbx.policy.precheck(q.name)
            self.record(
                **rec,
                status=dns.RCODE_NXDOMAIN,
                decision="deny",
                rule=pre.rule if pre else "dns",
                reason="name not allowed",
            )
            return dns.answer(q, dns.RCODE_NXDOMAIN)
        if q.qtype not in (dns.TYPE_A, dns.TYPE_AAAA):
            # Only addresses are ever looked up: no TXT/MX/... question leaves the host.
            self.record(**rec, status=0, decision="allow", rule="dns", reason="no data")
            return dns.answer(q, dns.RCODE_OK)
        try:
            addrs = await self.shared.resolver.resolve(q.name)
        except EgressRefused:  # the name does not resolve
            self.record(**rec, status=dns.RCODE_NXDOMAIN, decision="allow", rule="resolve")
            return dns.answer(q, dns.RCODE_NXDOMAIN)
        ips = [ipaddress.ip_address(a) for a in addrs]
        decision = self.sbx.policy.decide(q.name, ips, self.shared.guard)
        if not decision.allowed:
            self.record(
                **rec,
                status=dns.RCODE_NXDOMAIN,
                decision="deny",
                rule=decision.rule,
                reason=decision.reason,
            )
            return dns.answer(q, dns.RCODE_NXDOMAIN)
        self.record(**rec, status=0, decision="allow", rule=decision.rule)
        return dns.answer(q, dns.RCODE_OK, addrs)

    # -- CONNECT ------------------------------------------------------------------------------
    async def tunnel(self, conn: h11.Connection, authority: str, started: float) -> None:
        host, port = _authority(authority, None)
        target = await self.resolve_target(host, port)
        intercept = self.shared.intercepts(self.sbx, host)
        if intercept:
            await self.intercept(conn, target, started)
            return
        up_reader, up_writer = await self.dial(target)
        self.writer.write(
            conn.send(h11.Response(status_code=200, headers=[], reason=b"Connection established"))
            or b""
        )
        data, _closed = conn.trailing_data
        counts = [0, 0]
        status = 200
        try:
            first = await self._client_hello(data)
            sni = _sni(first)
            if sni is not None and sni.rstrip(".").lower() != host:
                status = 403
                raise Refused(
                    403, f"TLS server name {sni!r} does not match the tunnel to {host}", "sni"
                )
            up_writer.write(first)
            counts[0] += len(first)
            await _splice((self.reader, self.writer), (up_reader, up_writer), counts)
        except Refused as e:
            self.record(
                kind="connect",
                method="CONNECT",
                host=host,
                port=port,
                path=authority,
                status=403,
                decision="deny",
                rule=e.rule,
                reason=e.reason,
            )
            up_writer.close()
            return
        finally:
            up_writer.close()
            if status == 200:
                self.record(
                    kind="connect",
                    method="CONNECT",
                    host=host,
                    port=port,
                    path=authority,
                    status=200,
                    bytes_out=counts[0],
                    bytes_in=counts[1],
                    decision="allow",
                    rule=target.decision.rule,
                    duration_ms=round((time.monotonic() - started) * 1e3, 2),
                )

    async def _client_hello(self, data: bytes) -> bytes:
        """The client's first bytes: the whole first TLS record if it starts one, else what came
        (a client of a protocol where the server speaks first sends nothing: give up waiting)."""
        buf = data
        try:
            while True:
                if buf and buf[0] != 0x16:
                    return buf
                if len(buf) >= 5:
                    need = 5 + int.from_bytes(buf[3:5], "big")
                    if len(buf) >= need or len(buf) >= CLIENT_HELLO_MAX:
                        return buf
                chunk = await asyncio.wait_for(self.reader.read(CHUNK), 0.5 if not buf else 10)
                if not chunk:
                    return buf
                buf += chunk
        except TimeoutError:
            return buf

    async def intercept(self, conn: h11.Connection, target: Target, started: float) -> None:
        """TLS termination for a host with an injection rule: serve HTTP requests from the
        decrypted stream, each sent upstream over verified TLS with the credential added."""
        self.writer.write(
            conn.send(h11.Response(status_code=200, headers=[], reason=b"Connection established"))
            or b""
        )
        await self.writer.drain()
        data, _ = conn.trailing_data
        if data:  # a client must wait for the 200 before its ClientHello
            raise Refused(400, "data sent before the tunnel was established", "protocol")
        server_ctx = self.shared.ca.server_context(target.host)
        try:
            await asyncio.wait_for(self.writer.start_tls(server_ctx), 10)
        except (ssl.SSLError, TimeoutError, ConnectionError) as e:
            self.record(
                kind="mitm",
                method="CONNECT",
                host=target.host,
                port=target.port,
                status=0,
                decision="deny",
                rule="tls",
                reason=f"client TLS failed: {e}",
            )
            return
        ssl_obj = self.writer.get_extra_info("ssl_object")
        sni = getattr(ssl_obj, "server_hostname", None) if ssl_obj else None
        if sni and sni.rstrip(".").lower() != target.host:
            self.record(
                kind="mitm",
                host=target.host,
                status=403,
                decision="deny",
                rule="sni",
                reason=f"TLS server name {sni!r} does not match {target.host}",
            )
            return
        await self.serve_requests(target, tls=True)

    async def serve_requests(self, target: Target, tls: bool) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        while True:
            started = time.monotonic()
            try:
                ev = await self._event(conn, self.reader)
            except (h11.RemoteProtocolError, TimeoutError):
                return
            if not isinstance(ev, h11.Request):
                return
            try:
                host_hdr = _header(ev.headers, b"host")
                if host_hdr is not None:
                    h, p = _authority(host_hdr, target.port)
                    if h != target.host or p != target.port:
                        raise Refused(
                            403,
                            f"Host header {host_hdr!r} does not match the tunnel to {target.host}",
                            "host",
                        )
                await self.exchange(conn, ev, target, tls, started)
            except Refused as e:
                if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    body = f"sandhold egress proxy: {e.reason}\n".encode()
                    out = conn.send(
                        h11.Response(
                            status_code=e.status,
                            headers=[
                                ("Content-Type", "text/plain; charset=utf-8"),
                                ("Content-Length", str(len(body))),
                                ("Connection", "close"),
                                ("X-Sandhold-Egress", "denied" if e.status == 403 else "error"),
                            ],
                            reason=_phrase(e.status).encode(),
                        )
                    )
                    self.writer.write((out or b"") + (conn.send(h11.Data(data=body)) or b""))
                self.record(
                    kind="mitm" if tls else "http",
                    method=ev.method.decode(),
                    host=target.host,
                    port=target.port,
                    path=_path(ev.target),
                    status=e.status,
                    decision="deny",
                    rule=e.rule,
                    reason=e.reason,
                )
                return
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            try:
                conn.start_next_cycle()
            except h11.LocalProtocolError:
                return

    # -- HTTP ---------------------------------------------------------------------------------
    async def forward_plain(self, conn: h11.Connection, req: h11.Request, started: float) -> None:
        url = urlsplit(req.target.decode("ascii", "replace"))
        if url.scheme != "http":
            raise Refused(400, "use CONNECT (an https_proxy) for https:// URLs", "protocol")
        if url.username or url.password:
            raise Refused(400, "credentials in the URL are not forwarded", "protocol")
        try:
            host, port = _authority(url.netloc, 80)
        except ValueError:
            raise Refused(400, f"invalid URL {url.geturl()!r}", "protocol") from None
        host_hdr = _header(req.headers, b"host")
        if host_hdr is not None and _authority(host_hdr, 80) != (host, port):
            raise Refused(
                403, f"Host header {host_hdr!r} does not match the URL's host {host}", "host"
            )
        target = await self.resolve_target(host, port)
        # One request per connection: the next may go to another host, under a newer policy.
        await self.exchange(conn, req, target, False, started, keep_alive=False)

    async def exchange(
        self,
        conn: h11.Connection,
        req: h11.Request,
        target: Target,
        tls: bool,
        started: float,
        keep_alive: bool = True,
    ) -> None:
        """One request upstream and its response back; the credential is added here (TLS only,
        never over plain HTTP) and blanked out of what comes back."""
        injections = self.shared.injections(self.sbx, target.host) if tls else []
        replaced = {i.header.lower().encode() for i in injections}
        headers = [
            (k, v)
            for k, v in req.headers
            if k.lower() not in HOP_BY_HOP and k.lower() != b"host" and k.lower() not in replaced
        ]
        default = 443 if tls else 80
        host_value = target.host if target.port == default else f"{target.host}:{target.port}"
        if ":" in target.host:
            host_value = f"[{target.host}]" + ("" if target.port == default else f":{target.port}")
        headers.insert(0, (b"Host", host_value.encode()))
        headers += [(i.header.encode(), i.value.encode()) for i in injections]
        te = _header(req.headers, b"transfer-encoding")
        cl = _header(req.headers, b"content-length")
        if te is not None:
            headers.append((b"Transfer-Encoding", b"chunked"))
        elif cl is not None:
            headers.append((b"Content-Length", cl.encode()))
        headers.append((b"Connection", b"close"))
        up_reader, up_writer = await self.dial(target, tls=tls)
        up = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
        sent = received = 0
        status = 0
        try:
            up_writer.write(
                up.send(h11.Request(method=req.method, target=_path(req.target), headers=headers))
                or b""
            )
            if conn.they_are_waiting_for_100_continue:
                self.writer.write(
                    conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b""
                )
            while True:
                ev = await self._event(conn, self.reader)
                if isinstance(ev, h11.Data):
                    sent += len(ev.data)
                    up_writer.write(up.send(h11.Data(data=ev.data)) or b"")
                    await up_writer.drain()
                elif isinstance(ev, h11.EndOfMessage):
                    up_writer.write(up.send(h11.EndOfMessage()) or b"")
                    break
                else:
                    raise Refused(400, "request ended early", "protocol")
            await up_writer.drain()
            redact = Redactor([i.raw for i in injections])
            while True:
                try:
                    ev = await self._event(up, up_reader)
                except h11.RemoteProtocolError as e:
                    raise Refused(
                        502, f"invalid response from {target.host}: {e}", "upstream"
                    ) from None
                if isinstance(ev, h11.InformationalResponse):
                    continue
                if isinstance(ev, h11.Response):
                    break
                raise Refused(502, f"{target.host} closed the connection", "upstream")
            status = ev.status_code
            resp_headers = [
                (k, redact_header(v, redact))
                for k, v in ev.headers
                if k.lower() not in HOP_BY_HOP
                or k.lower() in (b"content-length", b"transfer-encoding")
            ]
            keep = keep_alive and conn.their_http_version == b"1.1" and not _closes(req.headers)
            if not keep:
                resp_headers.append((b"Connection", b"close"))
            self.writer.write(
                conn.send(h11.Response(status_code=status, headers=resp_headers, reason=ev.reason))
                or b""
            )
            while True:
                ev = await self._event(up, up_reader)
                if isinstance(ev, h11.Data):
                    received += len(ev.data)
                    out = redact.feed(ev.data)
                    if out:
                        self.writer.write(conn.send(h11.Data(data=out)) or b"")
                        await self.writer.drain()
                elif isinstance(ev, h11.EndOfMessage):
                    tail = redact.flush()
                    if tail:
                        self.writer.write(conn.send(h11.Data(data=tail)) or b"")
                    self.writer.write(conn.send(h11.EndOfMessage()) or b"")
                    await self.writer.drain()
                    break
                else:
                    break
        finally:
            up_writer.close()
            self.record(
                kind="mitm" if tls else "http",
                method=req.method.decode(),
                host=target.host,
                port=target.port,
                path=_path(req.target).decode("ascii", "replace"),
                status=status,
                bytes_out=sent,
                bytes_in=received,
                decision="allow",
                rule=target.decision.rule,
                injected=[i.secret for i in injections] or None,
                duration_ms=round((time.monotonic() - started) * 1e3, 2),
            )


def redact_header(value: bytes, redact: Redactor) -> bytes:
    for v in redact.values:
        value = value.replace(v, b"*" * len(v))
    return value


def _header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> str | None:
    for k, v in headers:
        if k.lower() == name:
            return v.decode("latin-1")
    return None


def _closes(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    value = _header(headers, b"connection")
    return value is not None and "close" in value.lower()


def _path(target: bytes) -> bytes:
    """Origin form of a request target (absolute URLs lose scheme and authority)."""
    if target.startswith(b"http://") or target.startswith(b"https://"):
        parts = urlsplit(target.decode("ascii", "replace"))
        path = parts.path or "/"
        return (path + ("?" + parts.query if parts.query else "")).encode()
    return target or b"/"


def _sni(data: bytes) -> str | None:
    """The server name of a TLS ClientHello (None if ``data`` is not one or has none)."""
    try:
        if len(data) < 9 or data[0] != 0x16 or data[5] != 0x01:
            return None
        p = 9 + 2 + 32  # record header, handshake header, version, random
        p += 1 + data[p]  # session id
        p += 2 + int.from_bytes(data[p : p + 2], "big")  # cipher suites
        p += 1 + data[p]  # compression methods
        end = p + 2 + int.from_bytes(data[p : p + 2], "big")
        p += 2
        while p + 4 <= min(end, len(data)):
            etype = int.from_bytes(data[p : p + 2], "big")
            elen = int.from_bytes(data[p + 2 : p + 4], "big")
            if etype == 0:
                q = p + 4 + 2
                while q + 3 <= p + 4 + elen:
                    ntype, nlen = data[q], int.from_bytes(data[q + 1 : q + 3], "big")
                    if ntype == 0:
                        return data[q + 3 : q + 3 + nlen].decode("ascii", "replace")
                    q += 3 + nlen
                return None
            p += 4 + elen
    except IndexError:
        return None
    return None


async def _copy(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, counts: list[int], i: int
) -> None:
    try:
        while data := await reader.read(CHUNK):
            counts[i] += len(data)
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


async def _splice(
    a: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    b: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    counts: list[int],
) -> None:
    try:
        await asyncio.gather(_copy(a[0], b[1], counts, 0), _copy(b[0], a[1], counts, 1))
    finally:
        a[1].close()
        b[1].close()


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def handler(get_sandbox: Callable[[], SandboxEgress | None], shared: Shared) -> Handler:
    """The connection callback of one sandbox's socket; the sandbox (and so its current policy)
    is looked up per connection, so a policy update applies to the next connection."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sbx = get_sandbox()
        if sbx is None:
            writer.close()
            return
        try:
            await Connection(sbx, shared, reader, writer).run()
        except SecretKeyError as e:
            log.error("sandbox %s: %s", sbx.id, e.message)
            writer.close()
        except Exception:
            log.exception("egress connection of sandbox %s failed", sbx.id)
            writer.close()

    return handle
