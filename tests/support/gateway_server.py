"""The gateway's tests' helpers: a real `sandhold gateway serve` process (``Gateway``,
``gateway_env``), the keys it knows, waiting, calling a tool, cleaning up after a run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from sandhold.config import Settings
from sandhold.runtime.runtime import Runtime
from tests.support.e2b_server import KEY_A, Server, listen, start_process, stop_process
from tests.support.e2b_server import destroy_runtime_dir as destroy_runtime_dir

ADMIN_KEY = "gateway-test-admin-key"


TENANT_KEY = "gateway-test-tenant-key-a"


OTHER_KEY = "gateway-test-tenant-key-b"


# Short lifecycle: keep-alive then pause after 2 s idle, reclaim 2 s after the pause.
FAST_POLICY = {"keep_alive_s": 2, "retention_s": 2, "max_command_timeout_s": 120}


def scratch_dir(prefix: str) -> Path:
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    d.chmod(0o755)  # sandboxes' unprivileged owner traverses it to the workspace binds
    return d


class Gateway:
    """One `sandhold gateway serve` process on a socket of the test's (as e2b_server.py's);
    can be stopped, killed and started again on the same port; ``close`` when done."""

    def __init__(self, data_dir: Path, env: dict[str, str], log: Path) -> None:
        self.data_dir = data_dir
        self.env = env
        self.sock = listen()
        self.port: int = self.sock.getsockname()[1]
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.workspaces = Path(env["SANDHOLD_GATEWAY_WORKSPACE_ROOT"])
        self.server: Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def sandbox_metadata(self, sandbox_id: str) -> dict[str, str]:
        """What the provider stores with a sandbox (asked directly, not through the gateway)."""
        if self.server is None:
            return Runtime(Settings(data_dir=self.data_dir)).get(sandbox_id).metadata
        with self.server.api() as api:
            return api.get(f"/sandboxes/{sandbox_id}").json()["metadata"]

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_")}
        env.update(self.env, NO_PROXY="127.0.0.1,localhost")
        self.proc = start_process(["gateway", "serve"], env, self.log, self.sock)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        stop_process(self.proc, sig)
        self.proc = None

    def close(self) -> None:
        """Stop the process and give the port up."""
        self.stop()
        self.sock.close()

    def client(self, key: str = TENANT_KEY) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {key}"}, timeout=120
        )

    def admin(self) -> httpx.Client:
        return self.client(ADMIN_KEY)


def gateway_env(
    data_dir: Path, provider: str, server: Server | None, name: str, **extra: Any
) -> dict[str, str]:
    tenants = {
        "acme": {"api_key": TENANT_KEY, "policy": FAST_POLICY},
        "globex": {"api_key": OTHER_KEY, "policy": FAST_POLICY},
    }
    env = {
        "SANDHOLD_DATA_DIR": str(data_dir),
        "SANDHOLD_GATEWAY_PROVIDER": provider,
        "SANDHOLD_GATEWAY_NAME": name,
        "SANDHOLD_GATEWAY_ADMIN_KEY": ADMIN_KEY,
        "SANDHOLD_GATEWAY_TENANTS": json.dumps(tenants),
        "SANDHOLD_GATEWAY_RECLAIM_INTERVAL_S": "0.5",
        "SANDHOLD_GATEWAY_WORKSPACE_ROOT": str(data_dir / "workspaces"),
        "SANDHOLD_LIFECYCLE_INTERVAL_S": "0.2",
        "SANDHOLD_PREBUILD_TEMPLATES": "[]",
    }
    if provider == "e2b":
        assert server is not None
        env.update(
            SANDHOLD_GATEWAY_E2B_API_URL=server.url,
            SANDHOLD_GATEWAY_E2B_SANDBOX_URL=server.url,
            SANDHOLD_GATEWAY_E2B_API_KEY=KEY_A,
        )
    env.update({f"SANDHOLD_{k.upper()}": str(v) for k, v in extra.items()})
    return env


WORKSPACES = Path("/var/tmp/sandhold-gateway-workspaces")


def kill_tagged(server: Server, name: str) -> int:
    """Kill what a gateway named ``name`` left on the e2b server; returns how many."""
    with server.api() as api:
        r = api.get("/v2/sandboxes", params={"metadata": f"sandhold.gateway={name}"})
        assert r.status_code == 200, r.text
        listed = r.json()
        for s in listed:
            api.delete(f"/sandboxes/{s['sandboxID']}")
    return len(listed)


def wait_for(predicate: Callable[[], Any], timeout: float = 30, interval: float = 0.1) -> Any:
    """Poll until ``predicate`` returns something truthy (waiting is not asserting speed)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


def tool(client: httpx.Client, session: str, tool_name: str, /, **args: Any) -> dict[str, Any]:
    r = client.post(f"/v1/sessions/{session}/tools/{tool_name}", json=args)
    assert r.status_code == 200, r.text
    return r.json()
