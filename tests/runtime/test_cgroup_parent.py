"""A data dir's cgroup parent (runtime/cgroup_parent.py): its own, claimed, so that no other
data dir's reconcile kills its sandboxes; a data dir of before names were written keeps its old
one."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandhold.config import Settings
from sandhold.errors import ConfigError
from sandhold.runtime import cgroup_parent, cgroups, instance
from sandhold.runtime.runtime import Runtime


@pytest.fixture
def top() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="sandhold-cgparent-", dir="/var/tmp"))
    yield d
    subprocess.run(["rm", "-rf", str(d)], check=True)


def test_two_data_dirs_can_never_open_on_one_parent(top: Path) -> None:
    registry = top / "registry"
    first = Settings(data_dir=top / "a", uid_registry=registry, cgroup_parent="sandhold-shared-t")
    second = first.model_copy(update={"data_dir": top / "b"})
    try:
        Runtime(first).open()
        with pytest.raises(ConfigError) as refused:
            Runtime(second).open()
        assert str(top / "a") in str(refused.value) and "cgroup_parent" in str(refused.value)
        assert not (top / "b" / "sandboxes").exists()  # refused before it took anything
        Runtime(first).open()  # the holder itself opens again (a restart, a CLI beside it)
        subprocess.run(["rm", "-rf", str(top / "a")], check=True)
        Runtime(second).open()  # the holder is gone for good: its parent is free
        assert (registry / "cgroup-sandhold-shared-t").read_text().split()[0] == instance.read(
            top / "b"
        )
        cgroup_parent.release(first)  # not its claim: kept
        assert (registry / "cgroup-sandhold-shared-t").exists()
        cgroup_parent.release(second)
        assert not (registry / "cgroup-sandhold-shared-t").exists()
    finally:
        cgroups.remove_parent("sandhold-shared-t")


def test_data_dirs_at_one_path_get_parents_of_their_own(top: Path) -> None:
    """The pod shape: each host mounts its own volume at the same path."""
    shared = top / "data"
    names = []
    for own in (top / "host-a", top / "host-b"):
        own.mkdir(parents=True)
        shared.mkdir(exist_ok=True)
        script = textwrap.dedent(f"""
            from pathlib import Path
            from sandhold.config import Settings
            from sandhold.runtime import cgroup_parent
            print(cgroup_parent.name(Settings(data_dir=Path("{shared}"))))
        """)
        bind = f'mount --bind {own} {shared} && exec {sys.executable} -c "$0"'
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", bind,
                            script], capture_output=True, text=True, timeout=60)  # fmt: skip
        assert r.returncode == 0, r.stderr
        names.append(r.stdout.strip())
        assert names[-1] == f"sandhold-{instance.read(own)}"  # written in the host's own volume
        assert (own / cgroup_parent.FILE).read_text().strip() == names[-1]
    assert names[0] != names[1]


def test_a_data_dir_with_sandboxes_of_before_keeps_their_parent(top: Path) -> None:
    d = top / "old"
    (d / "sandboxes" / "sbx1").mkdir(parents=True)  # running under the parent named by path
    legacy = "sandhold-" + hashlib.sha256(str(d).encode()).hexdigest()[:10]
    assert cgroup_parent.name(Settings(data_dir=d)) == legacy
    (d / "sandboxes" / "sbx1").rmdir()
    assert cgroup_parent.name(Settings(data_dir=d)) == legacy  # written: it never changes again
    fresh = top / "fresh"
    assert cgroup_parent.name(Settings(data_dir=fresh)) == f"sandhold-{instance.read(fresh)}"


def test_claims_of_removed_data_dirs_are_pruned(top: Path) -> None:
    registry = top / "registry"
    kept, removed = top / "kept", top / "removed"
    for d in (kept, removed):
        cgroup_parent.claim(Settings(data_dir=d, uid_registry=registry), f"g-{d.name}")
    subprocess.run(["rm", "-rf", str(removed)], check=True)
    assert cgroup_parent.prune(registry) == 1
    assert sorted(p.name for p in registry.iterdir()) == ["cgroup-g-kept"]
