"""The per-host egress daemon: one asyncio process per data dir, serving every sandbox's socket.

It is started by the runtime on demand (``control.EgressControl``) and lives apart from any
server process, like the sandboxes: a server restart does not interrupt egress. The runtime
tells it what changed through a control socket (``data_dir/egress/control.sock``, root only):
``sync`` re-reads every sandbox's ``egress.json`` and opens or closes sockets to match. With no
sandbox left to serve it exits, so nothing outlives the last egress sandbox.

Run as ``python -m sandhold.egress.daemon DATA_DIR``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import signal
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sandhold.audit import EGRESS_FIELDS, AuditLog
from sandhold.egress.ca import DeploymentCA
from sandhold.egress.config import EgressConfig
from sandhold.egress.connection import SandboxEgress, Shared
from sandhold.egress.header_rules import HeaderRule
from sandhold.egress.policy import CompiledPolicy, EgressPolicy, Guard
from sandhold.egress.proxy import handler
from sandhold.egress.resolver import Resolver
from sandhold.egress.secrets import SecretKeyError, open_store

log = logging.getLogger("sandhold.egress")

POLICY_FILE = "egress.json"  # host-only, next to the sandbox's state.json
SOCKET_DIR = "egress"  # bound read-only into the sandbox
SOCKET_NAME = "proxy.sock"
HOST_ADDRESS_REFRESH_S = 30.0


def host_addresses() -> list[str]:
    """Every address configured on this host (any interface), which sandboxes may not dial."""
    try:
        out = subprocess.run(
            ["ip", "-j", "addr", "show"], capture_output=True, text=True, timeout=5, check=True
        ).stdout
        return [
            a["local"]
            for link in json.loads(out)
            for a in link.get("addr_info", [])
            if "local" in a
        ]
    except (OSError, ValueError, subprocess.SubprocessError):
        return []


def read_sandbox(d: Path) -> SandboxEgress | None:
    try:
        raw = json.loads((d / POLICY_FILE).read_text())
        policy = EgressPolicy.model_validate(raw["policy"])
        rules = [HeaderRule.model_validate(r) for r in raw.get("header_rules") or []]
    except (OSError, ValueError, KeyError, ValidationError):
        return None
    return SandboxEgress(
        d.name, CompiledPolicy(policy), raw.get("tenant"), raw.get("session"), rules
    )


class Daemon:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.root = data_dir / "egress"
        self.sandboxes_dir = data_dir / "sandboxes"
        self.config: EgressConfig | None = None
        self.shared: Shared | None = None
        self.sandboxes: dict[str, SandboxEgress] = {}
        self.servers: dict[str, asyncio.AbstractServer] = {}
        self.stop = asyncio.Event()

    def configure(self, cfg: EgressConfig) -> None:
        if self.config == cfg and self.shared is not None:
            return
        upstream = ssl.create_default_context(
            cafile=str(cfg.upstream_ca_file) if cfg.upstream_ca_file else None
        )
        upstream.set_alpn_protocols(["http/1.1"])
        try:
            store = open_store(cfg)
        except SecretKeyError as e:
            log.error("secrets unavailable, no credential will be injected: %s", e.message)
            store = None
        old_audit = self.shared.audit if self.shared else None
        self.shared = Shared(
            guard=Guard(cfg.open_cidrs, host_addresses(), cfg.deny_cidrs),
            resolver=Resolver(cfg.hosts, cfg.dns_servers),
            audit=old_audit or AuditLog(self.root / "audit", EGRESS_FIELDS),
            upstream_tls=upstream,
            ca_factory=lambda: DeploymentCA(self.root / "ca"),
            secrets=store,
            connect_timeout=cfg.connect_timeout_s,
            idle_timeout=cfg.idle_timeout_s,
        )
        self.config = cfg

    async def sync(self) -> int:
        assert self.shared is not None
        found: dict[str, SandboxEgress] = {}
        if self.sandboxes_dir.is_dir():
            for d in self.sandboxes_dir.iterdir():
                # egress.json is written before the sandbox starts (its socket must exist by
                # then) and removed first when it dies.
                sbx = read_sandbox(d)
                if sbx is not None and not (d / "killing.json").exists():
                    found[d.name] = sbx
        self.sandboxes = found
        for sid in list(self.servers):
            if sid not in found:
                server = self.servers.pop(sid)
                server.close()
        for sid in found:
            if sid not in self.servers:
                path = self.sandboxes_dir / sid / SOCKET_DIR / SOCKET_NAME
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                old = os.umask(0o111)  # 0666: the sandbox's (unprivileged) agent connects
                try:
                    self.servers[sid] = await asyncio.start_unix_server(
                        handler(lambda sid=sid: self.sandboxes.get(sid), self.shared),  # type: ignore[misc]
                        path=str(path),
                        limit=65536,
                    )
                finally:
                    os.umask(old)
        return len(found)

    async def control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 10)
            req: dict[str, Any] = json.loads(line)
            if req.get("op") == "ping":
                writer.write(b'{"ok": true}\n')
                await writer.drain()
                return
            if req.get("op") != "sync":
                raise ValueError(f"unknown operation {req.get('op')!r}")
            if req.get("config") is not None:
                self.configure(EgressConfig.model_validate(req["config"]))
            if self.shared is None:
                raise ValueError("not configured: the first sync must carry the configuration")
            n = await self.sync()
            exiting = n == 0
            writer.write(
                json.dumps({"ok": True, "sandboxes": n, "exiting": exiting}).encode() + b"\n"
            )
            await writer.drain()
            if exiting:
                self.stop.set()
        except Exception as e:
            writer.write(json.dumps({"ok": False, "error": str(e)}).encode() + b"\n")
            with contextlib.suppress(ConnectionError):
                await writer.drain()
        finally:
            writer.close()

    async def refresh_host_addresses(self) -> None:
        while True:
            await asyncio.sleep(HOST_ADDRESS_REFRESH_S)
            if self.shared is not None:
                addrs = await asyncio.to_thread(host_addresses)
                if addrs:
                    self.shared.guard.set_host_addresses(addrs)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        path = self.root / "control.sock"
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        old = os.umask(0o177)
        try:
            control = await asyncio.start_unix_server(self.control, path=str(path))
        finally:
            os.umask(old)
        refresher = asyncio.create_task(self.refresh_host_addresses())
        log.info("egress daemon %d serving %s", os.getpid(), self.data_dir)
        await self.stop.wait()
        refresher.cancel()
        control.close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        for server in self.servers.values():
            server.close()
        if self.shared is not None:
            self.shared.audit.close()
        log.info("egress daemon %d exiting", os.getpid())


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s sandhold-egress: %(message)s")
    if len(argv) != 1:
        sys.stderr.write("usage: python -m sandhold.egress.daemon DATA_DIR\n")
        return 2
    data_dir = Path(argv[0])
    root = data_dir / "egress"
    root.mkdir(parents=True, exist_ok=True, mode=0o711)
    lock = os.open(root / "daemon.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another daemon serves this data dir
    os.ftruncate(lock, 0)
    os.write(lock, str(os.getpid()).encode())
    asyncio.run(Daemon(data_dir).run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
