"""The runtime on a cgroup-v2-only stock kernel (tests/support/guest.py): Debian's kernel under
QEMU, booted with the unified hierarchy only, runs tests/guest/v2_runtime.py: the runtime's
limits, pause, OOM, fork bomb, delegation and PID-namespace tests, and a tour through the
official SDK."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.support import guest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(1800)
def test_the_runtime_on_a_cgroup_v2_only_kernel() -> None:
    if shutil.which("qemu-system-x86_64") is None:
        pytest.fail("qemu-system-x86_64 is missing: scripts/install.sh installs it")
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
            "-o", "timeout=900", "tests/guest/v2_runtime.py"]  # fmt: skip
    env = {"SANDHOLD_TEST_START_TIMEOUT_S": "400"}  # emulated: a server starts in 20-50 s
    r = guest.run(" ".join(argv), cwd=REPO, env=env, timeout_s=1700)
    assert r.status == 0, f"{r.output[-8000:]}\n--- console ---\n{r.console[-3000:]}"
    assert " passed" in r.output and "skipped" not in r.output, r.output[-2000:]
