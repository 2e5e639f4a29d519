"""Staging directories of work cut short (runtime/staging.py): a template store or a layer
store removes those whose maker is gone, however deep and whoever owns them, and never one whose
maker still runs, whatever its age."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from sandhold.runtime import staging
from sandhold.runtime.templates.layers import NEW, LayerStore
from sandhold.runtime.templates.store import BUILD, PULL, TemplateStore
from sandhold.runtime.uids import UidPool


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def deep(d: Path, depth: int = 1500, owner: int = 1_234_567) -> None:
    """``depth`` nested directories under ``d``, owned by a uid no one here has, mode 0500."""
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("n", dir_fd=fd)
        nxt = os.open("n", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.close(fd)
    for p in [d, d / "n"]:
        os.chown(p, owner, owner)
        p.chmod(0o500)


def test_a_crashed_builds_staging_goes_and_a_running_ones_stays(tmp_path: Path) -> None:
    root = tmp_path / "templates"
    root.mkdir()
    pid = dead_pid()
    cut = root / f"{BUILD}{pid}-{staging.start_time(os.getpid())}-abc"
    cut.mkdir()
    deep(cut)
    unnamed = root / f"{PULL}x1y2z3"  # (made before makers were named)
    unnamed.mkdir()
    mine = staging.make(root, PULL)  # this process's: running, however old
    os.utime(mine, (0, 0))

    TemplateStore(root, uid_base=100_000)

    assert not cut.exists() and not unnamed.exists()
    assert mine.is_dir()


def test_a_layer_cut_short_goes_at_the_next_collection(tmp_path: Path) -> None:
    layers = LayerStore(
        tmp_path / ".layers", UidPool(tmp_path / "uids", tmp_path, 100_000, 1, False)
    )
    layers.root.mkdir()
    cut = layers.root / f"{NEW}{dead_pid()}-0-abc"
    cut.mkdir()
    deep(cut)
    kept = staging.make(layers.root, NEW)

    layers.collect(TemplateStore(tmp_path / "templates", uid_base=100_000))

    assert not cut.exists() and kept.is_dir()
