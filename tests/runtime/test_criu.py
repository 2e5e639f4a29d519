"""CRIU as scripts/install.sh leaves it, and what `sandhold doctor` says of it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from sandhold.config.runtime import RuntimeSettings
from sandhold.runtime.checkpoint.criu import criu_status

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "install-criu.sh"
DEFAULT = RuntimeSettings.model_fields["criu_path"].default


def test_the_setting_names_the_binary_the_script_installs():
    text = SCRIPT.read_text()
    version = re.search(r"^CRIU_VERSION=(\S+)$", text, re.M)[1]
    path = re.search(r"^CRIU_BIN=(\S+)", text, re.M)[1].replace("$CRIU_VERSION", version)
    assert (version, Path(path)) == ("4.1.1", DEFAULT)


def test_the_installed_binary_is_4_1_1_and_works_here():
    assert DEFAULT.is_file() and os.access(DEFAULT, os.X_OK), "run scripts/install.sh"
    out = subprocess.run([DEFAULT, "--version"], capture_output=True, text=True, timeout=60)
    assert out.stdout.splitlines()[0] == "Version: 4.1.1"
    check = subprocess.run([DEFAULT, "check"], capture_output=True, text=True, timeout=60)
    assert "Looks good." in check.stdout + check.stderr
    assert criu_status(DEFAULT) == (True, f"CRIU 4.1.1 at {DEFAULT}: criu check: Looks good.")


def test_a_missing_or_foreign_binary_is_not_usable(tmp_path):
    assert criu_status(tmp_path / "criu") == (False, f"not installed at {tmp_path / 'criu'}")
    ok, detail = criu_status(Path("/bin/true"))
    assert not ok and "does not report a CRIU version" in detail


def _doctor(settings, criu_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SANDHOLD_DATA_DIR": str(settings.data_dir),
           "SANDHOLD_CRIU_PATH": str(criu_path), "COLUMNS": "400"}  # fmt: skip
    return subprocess.run([sys.executable, "-m", "sandhold.cli", "doctor"], capture_output=True,
                          text=True, env=env, timeout=120)  # fmt: skip


def _row(out: str) -> str:
    return next(line for line in out.splitlines() if line.strip("│┃ ").startswith("CRIU"))


def test_doctor_row_of_the_installed_criu(settings):
    r = _doctor(settings, DEFAULT)
    assert r.returncode == 0, r.stderr
    row = _row(r.stdout)
    assert "ok" in row and "CRIU 4.1.1" in row and "Looks good." in row


def test_doctor_without_criu_is_optional_and_names_the_fix(settings, tmp_path):
    r = _doctor(settings, tmp_path / "nocriu")
    assert r.returncode == 0, r.stderr  # optional: pause works through the freezer
    row = _row(r.stdout)
    assert "optional" in row and "not installed at" in row and "scripts/install.sh" in row
