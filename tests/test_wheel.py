"""The built wheel carries everything the server needs outside the repository: every module,
and the files beside them (the agent's C sources and header, the console's static files, the
interpreter's runners, the store's migrations). A wheel install is how docs/deploy.md runs it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"


def test_the_wheel_holds_every_file_of_the_package(tmp_path: Path) -> None:
    # From a copy of what a release holds: a build directory left in the checkout would
    # carry files the package's own rules no longer name.
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, tree / name)
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(SRC, tree / "src", ignore=skip)
    # Without build isolation: the venv's setuptools, no index reached.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp_path), str(tree)],
                   check=True, capture_output=True, cwd=tmp_path)  # fmt: skip
    (wheel,) = tmp_path.glob("sandhold-*.whl")
    inside = set(zipfile.ZipFile(wheel).namelist())
    shipped = {
        str(p.relative_to(SRC))
        for p in (SRC / "sandhold").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    missing = sorted(shipped - inside)
    assert not missing, f"files of the package missing from the wheel: {missing}"
    assert "sandhold/agent/spawn_child.h" in inside and "sandhold/agent/native.c" in inside
