"""The commit-msg hook (scripts/git-hooks/commit-msg) that `make install` sets for a checkout:
the subjects it lets through and the ones it refuses, run as git runs it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

HOOK = Path(__file__).resolve().parents[1] / "scripts" / "git-hooks" / "commit-msg"


def verdict(tmp_path: Path, message: str) -> int:
    f = tmp_path / "COMMIT_EDITMSG"
    f.write_text(message)
    return subprocess.run([str(HOOK), str(f)], capture_output=True).returncode


@pytest.mark.parametrize("message", [
    "runtime: bwrap's mount points made real at every start\n\nWhy, the figure, the test.\n",
    "# a comment git adds\ndocs: one line\n",
    "e2b: " + "x" * 67,
    "Merge branch 'x'\n",
    "fixup! runtime: something\n",
])  # fmt: skip
def test_good_subjects_pass(tmp_path: Path, message: str) -> None:
    assert verdict(tmp_path, message) == 0


@pytest.mark.parametrize("message", [
    "runtime: " + "x" * 64,  # 73 characters
    "Runtime: capitalised prefix\n",
    "images: a prefix not in the list\n",
    "runtime, e2b: two prefixes\n",
    "no prefix at all\n",
    "",
])  # fmt: skip
def test_bad_subjects_are_refused(tmp_path: Path, message: str) -> None:
    assert verdict(tmp_path, message) == 1
