"""The `sandhold` command, run as a real process against a real data dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


@pytest.fixture
def cli(settings):
    env = {**os.environ, "SANDHOLD_DATA_DIR": str(settings.data_dir)}

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "sandhold.cli", *args], capture_output=True,
                              text=True, env=env, check=check, timeout=120)  # fmt: skip

    return run


def test_sandbox_commands_end_to_end(cli):
    sid = cli("sandbox", "create", "--memory-mb", "128", "--workspace", "cli-ws",
              "-e", "GREETING=hello", "-m", "session=s1").stdout.strip()  # fmt: skip
    try:
        listed = json.loads(cli("sandbox", "ls", "--json").stdout)
        mine = [s for s in listed if s["id"] == sid]
        assert mine and mine[0]["state"] == "running" and mine[0]["metadata"] == {"session": "s1"}
        r = cli("sandbox", "exec", sid, "--", "sh", "-c", "echo $GREETING; id -un; exit 3",
                check=False)  # fmt: skip
        assert r.returncode == 3
        assert r.stdout.split() == ["hello", "user"]
        r = cli("sandbox", "exec", sid, "--user", "root", "--", "id", "-u")
        assert r.stdout.strip() == "0"
        cli("sandbox", "pause", sid)
        paused = [s for s in json.loads(cli("sandbox", "ls", "--json").stdout) if s["id"] == sid]
        assert paused[0]["state"] == "paused"
        r = cli("sandbox", "exec", sid, "--", "true", check=False)
        assert r.returncode == 73 and "paused" in r.stderr  # Conflict
        r = cli("sandbox", "pause", sid, check=False)
        assert r.returncode == 73 and "already paused" in r.stderr
        cli("sandbox", "resume", sid)
        assert cli("sandbox", "exec", sid, "--", "echo", "back").stdout.strip() == "back"
    finally:
        cli("sandbox", "kill", sid, check=False)
    r = cli("sandbox", "kill", sid, check=False)
    assert r.returncode == 66 and "does not exist" in r.stderr  # NotFound


def test_bad_input_gives_clear_errors(cli):
    r = cli("sandbox", "create", "--template", "nope", check=False)
    assert r.returncode == 66 and "template 'nope' does not exist" in r.stderr
    r = cli("sandbox", "create", "--memory-mb", "1", check=False)
    assert r.returncode == 65 and "memory_mb" in r.stderr  # InvalidRequest
    r = cli("sandbox", "exec", "doesnotexist", "--", "true", check=False)
    assert r.returncode == 66 and "does not exist" in r.stderr  # NotFound


@pytest.mark.parametrize(
    ("args", "setting"),
    [
        ([f"-eV_{i}=x" for i in range(513)], "sandbox_env_max_vars"),
        ([f"-eV_{i}={'x' * 1024}" for i in range(300)], "sandbox_env_max_bytes"),  # 300 KiB
        ([f"-eBIG={'x' * (33 * 1024)}"], "sandbox_env_max_value_bytes"),
        ([f"-m{'k' * 257}=v"], "sandbox_metadata_max_key_bytes"),
        ([f"-mk{i}=v" for i in range(129)], "sandbox_metadata_max_keys"),
    ],
)
def test_create_has_the_bounds_of_the_service(cli, settings, args, setting):
    """The same limits as a create through the server (service/limits.py): 65, the setting
    named, nothing made."""
    before = sorted(p.name for p in (settings.data_dir / "sandboxes").glob("*"))
    r = cli("sandbox", "create", *args, check=False)
    assert r.returncode == 65 and setting in r.stderr, (r.returncode, r.stderr[-500:])
    assert len(r.stderr) < 500  # the oversized value is not echoed
    assert sorted(p.name for p in (settings.data_dir / "sandboxes").glob("*")) == before


def test_template_ls_and_doctor(cli):
    out = cli("template", "ls").stdout
    assert "base" in out and "host" in out
    r = cli("doctor")
    assert r.returncode == 0
    for check in ("bubblewrap", "user namespaces", "overlay", "seccomp", "kernel"):
        assert check in r.stdout
    assert os.uname().release[:12] in r.stdout  # the kernel it judged


def test_doctor_exits_69_when_a_required_check_fails(settings, tmp_path):
    """A host without bubblewrap (none on this PATH): the table still shows, then one line and
    HostUnsupported's status, 69, never 1 (Python's for a bug)."""
    env = {"PATH": str(tmp_path), "SANDHOLD_DATA_DIR": str(settings.data_dir)}
    r = subprocess.run([sys.executable, "-m", "sandhold.cli", "doctor"], capture_output=True,
                       text=True, env=env, timeout=120)  # fmt: skip
    assert r.returncode == 69, (r.returncode, r.stdout, r.stderr)
    assert "MISSING" in r.stdout and "bubblewrap" in r.stdout  # the table, with its fixes
    assert "required check(s) failed" in r.stderr and "bubblewrap" in r.stderr
    assert "Traceback" not in r.stderr
