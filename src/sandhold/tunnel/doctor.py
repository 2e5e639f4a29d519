"""``sandhold tunnel doctor``: why a connector cannot work, one line per problem and what to do.

In order: the gateway's name resolves, its port connects, TLS verifies, the token is accepted
for the tunnel (``GET /v1/tunnels/{id}``), and each internal MCP server answers ``server/discover``
(MCP 2026-07-28) or ``initialize``.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from sandhold.tunnel.connector_config import ConnectorConfig, resolve
from sandhold.tunnel.upstreams import discover_request, make_upstream


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def _network(cfg: ConnectorConfig) -> list[Check]:
    g = cfg.gateway
    if g.unix_socket:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(5)
                s.connect(g.unix_socket)
        except OSError as e:
            return [
                Check(
                    "connect",
                    False,
                    f"cannot connect to the unix socket {g.unix_socket}: "
                    f"{e.strerror or e} — is the sidecar or relay running?",
                )
            ]
        return [Check("connect", True, f"unix socket {g.unix_socket} accepts connections")]
    parts = urlsplit(g.url)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    try:
        addrs = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        return [
            Check(
                "dns",
                False,
                f"cannot resolve {host}: {e.strerror} — check gateway.url "
                "and this host's DNS (resolv.conf)",
            )
        ]
    checks = [Check("dns", True, f"{host} resolves to {addrs[0][4][0]}")]
    try:
        sock = socket.create_connection((host, port), timeout=5)
    except OSError as e:
        checks.append(
            Check(
                "connect",
                False,
                f"cannot connect to {host}:{port}: "
                f"{e.strerror or e} — is the gateway running there, and does the "
                "firewall let this host dial out to it?",
            )
        )
        return checks
    checks.append(Check("connect", True, f"{host}:{port} accepts connections"))
    with sock:
        if parts.scheme != "https":
            return checks
        ctx = ssl.create_default_context(cafile=g.ca_file)
        try:
            with ctx.wrap_socket(sock, server_hostname=host):
                pass
        except (ssl.SSLError, OSError) as e:
            checks.append(
                Check(
                    "tls",
                    False,
                    f"TLS with {host} failed: "
                    f"{getattr(e, 'reason', None) or e} — give the gateway's CA in "
                    "gateway.ca_file, or fix its certificate (name, expiry)",
                )
            )
            return checks
    checks.append(Check("tls", True, "the gateway's certificate verifies"))
    return checks


async def _token(cfg: ConnectorConfig) -> Check:
    g = cfg.gateway
    try:
        token = resolve(g.token, "gateway.token")
    except Exception as e:
        return Check(
            "token",
            False,
            f"{getattr(e, 'message', e)} — set it (the token of "
            "`sandhold tunnel create` or `sandhold tunnel token`)",
        )
    transport = httpx.AsyncHTTPTransport(uds=g.unix_socket, verify=g.ca_file or True)
    async with httpx.AsyncClient(
        base_url=g.url.rstrip("/"), transport=transport, timeout=10, trust_env=False
    ) as http:
        try:
            r = await http.get(
                f"/v1/tunnels/{g.tunnel_id}", headers={"Authorization": f"Bearer {token}"}
            )
        except httpx.HTTPError as e:
            return Check("token", False, f"the gateway did not answer: {e}")
    if r.status_code == 200:
        return Check("token", True, f"tunnel {r.json().get('name')!r} accepts this token")
    if r.status_code == 401:
        return Check(
            "token",
            False,
            "401: the gateway refused the token — it was rotated or "
            "mistyped; get the current one with `sandhold tunnel token ID`",
        )
    if r.status_code == 404:
        return Check(
            "token",
            False,
            f"404: the gateway has no tunnel {g.tunnel_id} for this "
            "token — check gateway.tunnel_id (`sandhold tunnel list`)",
        )
    return Check("token", False, f"HTTP {r.status_code} from the gateway: {r.text[:200]}")


async def _upstreams(cfg: ConnectorConfig) -> list[Check]:
    checks = []
    for u in cfg.upstream:
        up = make_upstream(u, cfg.limits.max_response_bytes, 10.0)
        where = u.url or " ".join(u.command or [])
        init = {
            "jsonrpc": "2.0",
            "id": "doctor",
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "sandhold-tunnel-doctor", "version": "0.1.0"},
            },
        }
        try:
            await up.start()
            answer = await up.forward(*discover_request("doctor"))  # MCP 2026-07-28
            if "result" in (answer.get("resp_json") or {}):
                checks.append(
                    Check(f"upstream {u.channel}", True, f"{where} answers server/discover")
                )
                continue
            answer = await up.forward(init, {})  # the handshake era
        except Exception as e:
            answer = {"resp_json": {"error": {"message": f"{type(e).__name__}: {e}"}}}
        finally:
            try:
                await up.close()
            except Exception:  # a server that failed to start has nothing to close
                pass
        body = answer.get("resp_json") or {}
        if "result" in body:
            checks.append(Check(f"upstream {u.channel}", True, f"{where} answers initialize"))
        else:
            why = (body.get("error") or {}).get("message", "no answer")
            checks.append(
                Check(
                    f"upstream {u.channel}",
                    False,
                    f"the internal MCP server at "
                    f"{where} is unreachable: {why} — is it running, and reachable "
                    "from this host?",
                )
            )
    return checks


def diagnose(cfg: ConnectorConfig) -> list[Check]:
    checks = _network(cfg)
    if all(c.ok for c in checks):
        checks.append(asyncio.run(_token(cfg)))
    checks += asyncio.run(_upstreams(cfg))
    return checks
