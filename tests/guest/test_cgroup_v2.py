"""The runtime on a cgroup-v2-only stock kernel (tests/support/guest.py): Debian's kernel under
QEMU, booted with the unified hierarchy only, runs tests/guest/v2_runtime.py (the v2 backend's
own limits, pause, OOM, fork bomb, delegation and PID-namespace tests, a tour through the
official SDK) and, unchanged, the suite's tests of what the backend carries: CRIU suspend,
restore after a restart and a reboot, fork, snapshots and warm starts, the limits, the disk
budget, uid isolation and reconcile after a server killed mid-create."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.support import guest

REPO = Path(__file__).resolve().parents[2]
# Chosen to prove the backend, not to repeat the suite: the guest runs ~20-50 times slower.
ON_V2 = [
    "tests/guest/v2_runtime.py",
    "tests/runtime/test_limits.py",
    "tests/runtime/test_suspend.py::test_suspend_frees_the_processes_and_resume_restores_their_memory",
    "tests/runtime/test_suspend.py::test_a_suspended_sandbox_survives_a_new_runtime",
    "tests/runtime/test_fork.py::test_forks_carry_the_memory_and_share_nothing",
    "tests/runtime/test_snapshots.py",
    "tests/runtime/test_warm.py::test_creates_start_from_the_checkpoint_with_their_own_identity",
    "tests/runtime/test_isolation.py::test_root_inside_is_nobody_on_the_host",
    "tests/runtime/test_crash.py::test_server_killed_during_creates_leaves_only_working_sandboxes",
    "tests/security/test_disk_attacks.py::test_filling_the_writable_layer_fails_inside_and_costs_the_host_at_most_the_budget",
    "tests/e2b/test_suspend.py::test_suspended_sandbox_survives_a_reboot_and_resumes_with_its_memory",
    "tests/e2b/test_fork.py::test_fork_carries_memory_into_independent_sandboxes",
]


@pytest.mark.timeout(2400)
def test_the_runtime_on_a_cgroup_v2_only_kernel() -> None:
    if shutil.which("qemu-system-x86_64") is None:
        pytest.fail("qemu-system-x86_64 is missing: scripts/install.sh installs it")
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
            "-o", "timeout=900", "--durations=0", *ON_V2]  # fmt: skip
    env = {"SANDHOLD_TEST_START_TIMEOUT_S": "400"}  # emulated: a server starts in 20-50 s
    r = guest.run(" ".join(argv), cwd=REPO, env=env, timeout_s=2300)
    assert r.status == 0, f"{r.output[-8000:]}\n--- console ---\n{r.console[-3000:]}"
    assert " passed" in r.output and "skipped" not in r.output, r.output[-2000:]


@pytest.mark.timeout(1200)
def test_the_shipped_unit_under_systemd_on_cgroup_v2() -> None:
    """deploy/systemd/sandhold.service under this machine's systemd (Debian 12's 252), booted as
    the guest's PID 1: tests/guest/under_systemd.py."""
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
            "-o", "timeout=900", "tests/guest/under_systemd.py"]  # fmt: skip
    r = guest.run(" ".join(argv), cwd=REPO, timeout_s=1100, systemd=True)
    assert r.status == 0, f"{r.output[-8000:]}\n--- console ---\n{r.console[-3000:]}"
    assert " passed" in r.output and "skipped" not in r.output, r.output[-2000:]
