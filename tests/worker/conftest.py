"""Fixtures of the worker tests: a real gateway (local provider, real sandboxes), the stand-in
control plane, and `sandhold worker` processes between them (tests/support/worker.py)."""

from __future__ import annotations

import json
import os
import shutil
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
)
from tests.support.worker import POLICY, Worker
from tests.worker.control_plane import ControlPlane


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
