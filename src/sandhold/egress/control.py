"""The runtime's side of egress: write a sandbox's egress record, prepare what is bound into it
(socket directory, resolv.conf, CA bundle) and keep the host's egress daemon in step."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from sandhold.config import Settings
from sandhold.egress.config import EgressConfig
from sandhold.egress.daemon import POLICY_FILE, SOCKET_DIR, SOCKET_NAME
from sandhold.egress.header_rules import HeaderRule
from sandhold.egress.policy import EgressPolicy
from sandhold.errors import EgressUnavailable

# Where things appear inside a sandbox with egress.
SANDBOX_DIR = "/run/sandhold-egress"
SANDBOX_SOCKET = f"{SANDBOX_DIR}/{SOCKET_NAME}"
SANDBOX_CA_BUNDLE = f"{SANDBOX_DIR}/ca-bundle.pem"
PROXY_PORT = 3128
DNS_PORT = 53
SYSTEM_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
START_TIMEOUT_S = 10.0

_spawn_lock = threading.Lock()
_daemons: dict[Path, subprocess.Popen[bytes]] = {}


def sandbox_env() -> dict[str, str]:
    """The environment of every process in a sandbox with egress."""
    proxy = f"http://127.0.0.1:{PROXY_PORT}"
    no_proxy = "localhost,127.0.0.1,::1"
    return {
        "HTTP_PROXY": proxy,
        "HTTPS_PROXY": proxy,
        "http_proxy": proxy,
        "https_proxy": proxy,
        "NO_PROXY": no_proxy,
        "no_proxy": no_proxy,
        "SSL_CERT_FILE": SANDBOX_CA_BUNDLE,
        "REQUESTS_CA_BUNDLE": SANDBOX_CA_BUNDLE,
        "CURL_CA_BUNDLE": SANDBOX_CA_BUNDLE,
        "NODE_EXTRA_CA_CERTS": SANDBOX_CA_BUNDLE,
        "PIP_CERT": SANDBOX_CA_BUNDLE,
        "GIT_SSL_CAINFO": SANDBOX_CA_BUNDLE,
    }


def agent_config() -> dict[str, Any]:
    return {"socket": SANDBOX_SOCKET, "proxy_port": PROXY_PORT, "dns_port": DNS_PORT}


class EgressControl:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.root = settings.data_dir / "egress"
        self.control_path = self.root / "control.sock"

    @property
    def config(self) -> EgressConfig:
        return EgressConfig.from_settings(self.settings)

    # -- per sandbox --------------------------------------------------------------------------
    def prepare(
        self,
        sandbox_dir: Path,
        policy: EgressPolicy,
        tenant: str | None,
        session: str | None,
        header_rules: list[HeaderRule],
    ) -> list[tuple[str, str, bool]]:
        """Write the sandbox's egress record and bound files; returns the binds (host,
        sandbox, read_only) to add. The daemon is synced by the caller before the sandbox
        starts."""
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o711)
        from sandhold.egress.ca import DeploymentCA  # cryptography: only when egress is used

        bound = sandbox_dir / SOCKET_DIR
        bound.mkdir(mode=0o755, exist_ok=True)
        bundle = b""
        if SYSTEM_BUNDLE.exists():
            bundle += SYSTEM_BUNDLE.read_bytes()
        for extra in self.settings.egress_sandbox_ca_files:
            bundle += b"\n" + Path(extra).read_bytes()
        bundle += b"\n" + DeploymentCA(self.root / "ca").cert_pem()
        (bound / "ca-bundle.pem").write_bytes(bundle)
        (bound / "resolv.conf").write_text(
            "# answered by the sandbox's egress proxy (only names the policy allows)\n"
            "nameserver 127.0.0.1\noptions timeout:2 attempts:2\n"
        )
        for f in ("ca-bundle.pem", "resolv.conf"):
            os.chmod(bound / f, 0o644)
        self.write_policy(sandbox_dir, policy, tenant, session, header_rules)
        return [
            (str(bound), SANDBOX_DIR, True),
            (str(bound / "resolv.conf"), "/etc/resolv.conf", True),
        ]

    @staticmethod
    def write_policy(
        sandbox_dir: Path,
        policy: EgressPolicy,
        tenant: str | None,
        session: str | None,
        header_rules: list[HeaderRule],
    ) -> None:
        rules = EgressPolicy(mode=policy.mode, allow=policy.allow, deny=policy.deny)
        record = {
            "policy": rules.model_dump(),
            "tenant": tenant,
            "session": session,
            "header_rules": [r.model_dump() for r in header_rules],
        }
        tmp = sandbox_dir / (POLICY_FILE + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, sandbox_dir / POLICY_FILE)

    @staticmethod
    def forget(sandbox_dir: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            (sandbox_dir / POLICY_FILE).unlink()

    # -- the daemon ---------------------------------------------------------------------------
    def _request(self, payload: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(self.control_path))
            s.sendall(json.dumps(payload).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    raise ConnectionError("the egress daemon closed the connection")
                data += chunk
        return json.loads(data)

    def sync(self, start: bool = True) -> None:
        """Make the daemon serve exactly the sandboxes that have an egress record; start it if
        ``start`` and it is not running. Returns once every socket is listening."""
        payload = {"op": "sync", "config": self.config.model_dump(mode="json")}
        deadline = time.monotonic() + START_TIMEOUT_S
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                reply = self._request(payload)
            except (OSError, ValueError) as e:
                last = e
                if not start:
                    return  # not running: nothing to tell it
                self._spawn()
                time.sleep(0.02)
                continue
            if not reply.get("ok"):
                raise EgressUnavailable(f"the egress daemon refused: {reply.get('error')}")
            if reply.get("exiting"):
                self._reap(wait=True)
            return
        raise EgressUnavailable(f"the egress daemon did not start: {last}")

    def _spawn(self) -> None:
        with _spawn_lock:
            self._reap(wait=False)
            proc = _daemons.get(self.root)
            if proc is not None and proc.poll() is None:
                return  # starting
            self.root.mkdir(parents=True, exist_ok=True)
            log = os.open(
                self.root / "daemon.log",
                os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                0o600,
            )
            try:
                _daemons[self.root] = subprocess.Popen(
                    [sys.executable, "-m", "sandhold.egress.daemon", str(self.settings.data_dir)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,  # outlives this process, like the sandboxes
                )
            finally:
                os.close(log)

    def _reap(self, wait: bool) -> None:
        """Collect our daemon child once it has exited (it is ours to wait for, no zombie)."""
        proc = _daemons.get(self.root)
        if proc is None:
            return
        try:
            proc.wait(5 if wait else 0)
        except subprocess.TimeoutExpired:
            return
        _daemons.pop(self.root, None)

    def running(self) -> bool:
        try:
            self._request({"op": "ping"}, timeout=2)
        except (OSError, ValueError):
            return False
        return True
