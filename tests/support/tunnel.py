"""The tunnel tests' world (``World``): a "private network" (a network namespace of the test's
own, with only its loopback up) holding the internal MCP server (streamable HTTP on its
127.0.0.1, ``MCP_PORT``) and, when started, the connector (`sandhold tunnel connect`, run inside
it with ``ip netns exec``), which reaches the gateway only through a unix socket relayed to the
gateway's loopback port (the namespace has no route anywhere). The gateways are real `sandhold
gateway serve` processes in the host's namespace (``TUNNEL_SETTINGS``); ``close`` removes
everything (processes, namespace). Also: tunnels created through the admin API
(``create_tunnel``, ``admin``), stopping a process (``stop``), the repository's root (``REPO``)."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx

from tests.support.gateway_server import (
    ADMIN_KEY,
    Gateway,
    destroy_runtime_dir,
    gateway_env,
    scratch_dir,
    wait_for,
)

REPO = Path(__file__).resolve().parents[2]
MCP_PORT = 3001
TUNNEL_SETTINGS = {
    "gateway_tunnel_stale_s": 2,
    "gateway_tunnel_pickup_timeout_s": 3,
    "gateway_tunnel_call_timeout_s": 15,
    "gateway_tunnel_tools_ttl_s": 1,
    "gateway_tunnel_max_request_bytes": 65536,
    "gateway_tunnel_max_response_bytes": 65536,
    "gateway_tunnel_poll_max_s": 5,
    "gateway_tunnel_relay_interval_s": 0.05,
    "secrets_keys": json.dumps(["A" * 43]),
}


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def stop(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class World:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.ns = f"shtun-{secrets.token_hex(3)}"
        self.env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.env = {k: v for k, v in self.env.items() if not k.startswith("SANDHOLD_")}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.connector: subprocess.Popen[bytes] | None = None
        self.gateways: list[Gateway] = []
        _run("ip", "netns", "add", self.ns)
        _run("ip", "-n", self.ns, "link", "set", "lo", "up")
        self.mcp = self.in_ns(
            [sys.executable, "-m", "tests.tunnel.servers", "http", str(MCP_PORT)], "mcp-http.log"
        )
        wait_for(self.mcp_answers)

    def in_ns(
        self, argv: list[str], log: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with open(self.dir / log, "ab") as out:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", self.ns, *argv],
                env=env or self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
        self.procs.append(proc)
        return proc

    def mcp_answers(self) -> bool:
        """The internal server answers, asked from inside its namespace."""
        probe = (
            f"import httpx,sys; r=httpx.post('http://127.0.0.1:{MCP_PORT}/mcp', json={{'jsonrpc':"
            "'2.0','id':1,'method':'initialize','params':{'protocolVersion':'2025-11-25',"
            "'capabilities':{},'clientInfo':{'name':'p','version':'0'}}}, headers={'Accept':"
            "'application/json, text/event-stream'}); sys.exit(0 if 'corp-internal' in "
            "r.text else 1)"
        )
        r = subprocess.run(
            ["ip", "netns", "exec", self.ns, sys.executable, "-c", probe],
            capture_output=True,
            env=self.env,
        )
        return r.returncode == 0

    def gateway(self, **extra: Any) -> Gateway:
        data_dir = scratch_dir("sandhold-gw-tun-")
        name = f"t{uuid.uuid4().hex[:10]}"
        env = gateway_env(data_dir, "local", None, name, **{**TUNNEL_SETTINGS, **extra})
        gw = Gateway(data_dir, env, self.dir / f"gateway-{name}.log")
        self.gateways.append(gw)
        gw.start()
        return gw

    def relay(self, gw: Gateway) -> Path:
        """A unix socket leading to ``gw``'s port (the namespace's only way out)."""
        path = self.dir / f"gw-{gw.port}.sock"
        if not path.exists():
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.tunnel.relay", str(path), str(gw.port)],
                env=self.env,
                cwd=REPO,
            )
            self.procs.append(proc)
            wait_for(path.exists)
        return path

    def config(
        self, gw: Gateway, tunnel_id: str, token: str, name: str = "connector", **gateway_extra: Any
    ) -> Path:
        path = self.dir / f"{name}.toml"
        (self.dir / f"{name}.token").write_text(token + "\n")
        gateway = {
            "url": f"http://127.0.0.1:{gw.port}",
            "tunnel_id": tunnel_id,
            "token": f"file:{self.dir / f'{name}.token'}",
            "unix_socket": str(self.relay(gw)),
            "poll_timeout_ms": 2000,
            "backoff_initial_s": 0.1,
            "backoff_max_s": 1.0,
            **gateway_extra,
        }
        lines = [
            "[gateway]",
            *(f"{k} = {json.dumps(v)}" for k, v in gateway.items()),
            "[health]",
            f'listen = "unix:{self.dir / f"{name}-health.sock"}"',
            "[[upstream]]",
            'channel = "main"',
            f'url = "http://127.0.0.1:{MCP_PORT}/mcp"',
            "[[upstream]]",
            'channel = "a"',
            f"command = {json.dumps([sys.executable, '-m', 'tests.tunnel.servers', 'stdio'])}",
            f"env = {{ PYTHONPATH = {json.dumps(str(REPO))} }}",
        ]
        path.write_text("\n".join(lines) + "\n")
        return path

    def health(self, name: str = "connector") -> httpx.Client:
        sock = self.dir / f"{name}-health.sock"
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://c")

    def start_connector(self, config: Path, name: str = "connector") -> subprocess.Popen[bytes]:
        sock = self.dir / f"{name}-health.sock"
        sock.unlink(missing_ok=True)
        proc = self.in_ns(
            [sys.executable, "-m", "sandhold.cli", "tunnel", "connect", "--config", str(config)],
            f"{name}.log",
        )

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError((self.dir / f"{name}.log").read_text()[-3000:])
            if not sock.exists():  # (httpx leaks the socket of a failed unix connect)
                return False
            try:
                with self.health(name) as h:
                    return h.get("/readyz").status_code == 200
            except httpx.TransportError:
                return False

        wait_for(ready)
        return proc

    def close(self) -> list[str]:
        for proc in reversed(self.procs):
            stop(proc)
        problems: list[str] = []
        for gw in self.gateways:
            gw.close()
            problems += destroy_runtime_dir(gw.data_dir)
        subprocess.run(["ip", "netns", "del", self.ns], check=False, capture_output=True)
        return problems


def admin(gw: Gateway) -> httpx.Client:
    return httpx.Client(
        base_url=gw.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=60
    )


def create_tunnel(gw: Gateway, tenant: str, name: str) -> dict[str, Any]:
    with admin(gw) as a:
        r = a.post(
            f"/v1/admin/tenants/{tenant}/tunnels", json={"name": name, "description": "test"}
        )
    assert r.status_code == 201, r.text
    return dict(r.json())
