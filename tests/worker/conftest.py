"""A real gateway (local provider, real sandboxes), the stand-in control plane, and `sandhold
worker` processes between them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.gateway_server import (
    TENANT_KEY,
    Gateway,
    destroy_runtime_dir,
    gateway_env,
    scratch_dir,
    wait_for,
)
from tests.worker.control_plane import ControlPlane

# Sandboxes stay up for the whole module: recovery must find the session's own sandbox.
POLICY = {"keep_alive_s": 300, "retention_s": 600, "max_command_timeout_s": 200}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data_dir = scratch_dir("sandhold-wk-gw-")
    workspaces = scratch_dir("sandhold-wk-ws-")
    name = f"w{uuid.uuid4().hex[:10]}"
    env = gateway_env(data_dir, "local", None, name, gateway_workspace_root=workspaces)
    env["SANDHOLD_GATEWAY_TENANTS"] = json.dumps(
        {"acme": {"api_key": TENANT_KEY, "policy": POLICY}}
    )
    gw = Gateway(data_dir, env, tmp_path_factory.mktemp("wk") / "gateway.log")
    gw.start()
    yield gw
    gw.close()
    problems = destroy_runtime_dir(data_dir)
    shutil.rmtree(workspaces, ignore_errors=True)
    assert not problems, problems


@pytest.fixture
def control_plane() -> Iterator[ControlPlane]:
    with ControlPlane() as cp:
        yield cp


class Worker:
    """One `sandhold worker` process."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sandhold.cli", "worker", *args], env=env,
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def start_worker(
    gateway: Gateway, control_plane: ControlPlane, tmp_path: Path
) -> Iterator[Callable[..., Worker]]:
    """Start workers on the control plane's environment; all are stopped at the end."""
    started: list[Worker] = []

    def start(worker_id: str, **settings: str) -> Worker:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SANDHOLD_", "ANTHROPIC_"))}  # fmt: skip
        env.update({
            "SANDHOLD_DATA_DIR": str(tmp_path / worker_id),
            "SANDHOLD_WORKER_BASE_URL": control_plane.url,
            # The SDK's own variable for the key: the setting falls back to it.
            "ANTHROPIC_ENVIRONMENT_KEY": control_plane.environment_key,
            "SANDHOLD_WORKER_GATEWAY_URL": gateway.url,
            "SANDHOLD_WORKER_GATEWAY_KEY": TENANT_KEY,
            "SANDHOLD_WORKER_MAX_IDLE_S": "1",
            "NO_PROXY": "127.0.0.1,localhost",
        })  # fmt: skip
        env.update({f"SANDHOLD_WORKER_{k.upper()}": v for k, v in settings.items()})
        args = ["--environment-id", control_plane.environment_id, "--worker-id", worker_id]
        w = Worker(args, env, tmp_path / f"{worker_id}.log")
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()


def sandbox_of(gateway: Gateway, session_id: str) -> str | None:
    """The session's sandbox as the gateway records it."""
    with gateway.client() as c:
        rows = c.get("/v1/sessions").json()
    return next((r["sandbox_id"] for r in rows if r["session_id"] == session_id), None)


def text_of(result: dict[str, object]) -> str:
    """The text of a tool result event's content blocks."""
    blocks = result["content"]
    assert isinstance(blocks, list)
    return "\n".join(str(b["text"]) for b in blocks if b["type"] == "text")


def workspace(gateway: Gateway, session_id: str) -> Path:
    return gateway.workspaces / "acme" / session_id


__all__ = ["sandbox_of", "text_of", "wait_for", "workspace"]
