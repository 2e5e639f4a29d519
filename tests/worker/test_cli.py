"""`sandhold worker` refuses a configuration it cannot serve, before polling anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.worker import Worker
from tests.worker.control_plane import ControlPlane


def run_worker(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SANDHOLD_", "ANTHROPIC_"))}
    return subprocess.run(
        [sys.executable, "-m", "sandhold.cli", "worker"], capture_output=True, text=True,
        env={**base, "SANDHOLD_DATA_DIR": str(tmp_path), **env}, timeout=60,
    )  # fmt: skip


def test_missing_settings_are_named(tmp_path: Path) -> None:
    r = run_worker({}, tmp_path)
    assert r.returncode == 78
    assert "worker_environment_id" in r.stderr and "ANTHROPIC_ENVIRONMENT_ID" in r.stderr
    sdk_vars = {"ANTHROPIC_ENVIRONMENT_ID": "env_x", "ANTHROPIC_ENVIRONMENT_KEY": "k"}
    r = run_worker(sdk_vars, tmp_path)
    assert r.returncode == 78
    assert "SANDHOLD_WORKER_GATEWAY_KEY" in r.stderr


def test_a_refused_environment_key_ends_the_worker(tmp_path: Path) -> None:
    with ControlPlane() as cp:
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("SANDHOLD_", "ANTHROPIC_"))}  # fmt: skip
        env = {**base, "SANDHOLD_DATA_DIR": str(tmp_path), "NO_PROXY": "127.0.0.1",
               "SANDHOLD_WORKER_BASE_URL": cp.url, "SANDHOLD_WORKER_GATEWAY_KEY": "g" * 20,
               "SANDHOLD_WORKER_ENVIRONMENT_KEY": "sk-ant-oat01-wrong",
               "SANDHOLD_WORKER_ENVIRONMENT_ID": cp.environment_id}  # fmt: skip
        worker = Worker([], env, tmp_path / "worker.log")
        assert worker.wait() == 1  # a 401 on poll is permanent: the SDK's loop gives up
    assert "401" in worker.output()
