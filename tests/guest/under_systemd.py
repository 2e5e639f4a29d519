"""The shipped unit, deploy/systemd/sandhold.service, under this machine's own systemd booted as
PID 1 in the cgroup v2 guest: run there by test_cgroup_v2.py; skipped anywhere else. The unit is
installed as its header says, with one drop-in that starts the checkout's server instead of
/opt/sandhold's."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandhold.config import Settings
from sandhold.runtime import cgroup_parent, cgroup_scope, cgroups, safefs
from tests.support.e2b_server import KEY_A
from tests.support.http import answers

REPO = Path(__file__).resolve().parents[2]
SYSTEM = Path("/etc/systemd/system")
pytestmark = pytest.mark.skipif(
    Path("/proc/1/comm").read_text().strip() != "systemd" or cgroups.kind() != "v2",
    reason="runs in the cgroup v2 guest booted with systemd",
)


def systemctl(*args: str) -> str:
    r = subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"systemctl {' '.join(args)}: {r.stdout}{r.stderr}{journal()}"
    return r.stdout.strip()


def journal() -> str:
    r = subprocess.run(["journalctl", "-u", "sandhold", "--no-pager", "-n", "60"],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    return r.stdout


def wait_healthy(url: str) -> None:
    if not answers(f"{url}/health", 400):  # emulated: a server starts in 20-50 s
        raise AssertionError(f"the unit's server never answered: {journal()}")


def groups_outside(*trees: Path) -> set[Path]:
    every = cgroups.CGROUP_ROOT.rglob("*")
    return {d for d in every if d.is_dir() and not any(d.is_relative_to(t) for t in trees)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def installed() -> Iterator[tuple[str, Path]]:
    """The unit installed and started over a settings file at the path it names; the url and
    the data dir. Stopped and uninstalled after."""
    data_dir = Path(tempfile.mkdtemp(prefix="sandhold-unit-", dir="/var/tmp"))
    data_dir.chmod(0o755)
    port = free_port()
    etc = Path("/etc/sandhold")
    etc.mkdir(exist_ok=True)
    (etc / "sandhold.toml").write_text(
        f'[runtime]\ndata_dir = "{data_dir}"\n\n'
        f'[server]\nport = {port}\nprebuild_templates = []\napi_keys = {{ "{KEY_A}" = "team-a" }}\n'
    )
    shutil.copy(REPO / "deploy/systemd/sandhold.service", SYSTEM / "sandhold.service")
    (SYSTEM / "sandhold.service.d").mkdir(exist_ok=True)
    (SYSTEM / "sandhold.service.d/checkout.conf").write_text(
        f"[Service]\nExecStart=\nExecStart={sys.executable} -m sandhold.cli serve\n"
    )
    systemctl("daemon-reload")
    systemctl("start", "sandhold")
    try:
        yield f"http://127.0.0.1:{port}", data_dir
    finally:
        subprocess.run(["systemctl", "stop", "sandhold"], timeout=600, check=False)
        safefs.remove_quietly(data_dir)


def test_the_unit_restarts_while_its_sandboxes_live_in_their_scope(installed):
    """The server stays in its unit's group and makes its sandboxes in a delegated scope beside
    it; nothing else changes. A restart (the one systemd 252 refuses when sandboxes run below
    the unit's own group) finds the sandbox running; stopping the scope kills it."""
    from e2b import Sandbox

    url, data_dir = installed
    wait_healthy(url)
    unit = cgroups.CGROUP_ROOT / systemctl("show", "-P", "ControlGroup", "sandhold").lstrip("/")
    scope = unit.parent / "sandhold-sandboxes.scope"
    before = groups_outside(unit, scope)
    sdk = {"api_url": url, "sandbox_url": url, "api_key": KEY_A}
    sbx = Sandbox.create(timeout=600, **sdk)
    assert sbx.commands.run("cat /proc/self/cgroup").stdout.strip() == "0::/"
    main = systemctl("show", "-P", "MainPID", "sandhold")
    assert cgroup_of(main) == unit
    group = scope / cgroup_parent.name(Settings(data_dir=data_dir)) / sbx.sandbox_id
    assert (group / "memory.max").read_text().strip() != "max"  # its limits, in the scope
    assert (scope / cgroup_scope.HOLDER_LEAF / "cgroup.procs").read_text().split()
    assert groups_outside(unit, scope) == before

    systemctl("restart", "sandhold")
    wait_healthy(url)
    again = Sandbox.connect(sbx.sandbox_id, timeout=600, **sdk)
    assert again.commands.run("echo again").stdout.strip() == "again"
    assert cgroup_of(systemctl("show", "-P", "MainPID", "sandhold")) == unit
    assert groups_outside(unit, scope) == before

    systemctl("stop", "sandhold-sandboxes.scope")
    assert not scope.exists() and not group.exists()
    assert not again.is_running()


def cgroup_of(pid: str) -> Path:
    return cgroups.CGROUP_ROOT / Path(f"/proc/{pid}/cgroup").read_text().strip()[4:]
