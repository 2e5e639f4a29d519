"""The host-wide uid registry (runtime/uids.py) when data dirs share a path: two hosts of a fleet
in pods mount a volume each at the same path. Each "host" here is a process in a mount namespace
of its own with its own directory bound at that path; the registry is shared, as on a node."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandhold.runtime import instance
from sandhold.runtime.uids import UidPool

UID_BASE = 3_000_000_000  # far above every runtime of the suite: no range of theirs is touched


@pytest.fixture
def place() -> Iterator[tuple[Path, Path, Path, Path]]:
    """A registry, the shared path, and two hosts' own directories."""
    top = Path(tempfile.mkdtemp(prefix="sandhold-samepath-", dir="/var/tmp"))
    registry, shared, a, b = (top / n for n in ("registry", "data", "host-a", "host-b"))
    for d in (shared, a, b):
        d.mkdir()
    yield registry, shared, a, b
    subprocess.run(["rm", "-rf", str(top)], check=True)


def as_host(own: Path, shared: Path, registry: Path, code: str) -> list[str]:
    """Run ``code`` (with ``pool``, a UidPool over ``shared``) in a mount namespace where
    ``own`` is bound at ``shared``; its printed lines."""
    script = textwrap.dedent(f"""
        from pathlib import Path
        from sandhold.runtime.uids import UidPool
        pool = UidPool(Path("{registry}"), Path("{shared}"), {UID_BASE}, 8, True)
    """) + textwrap.dedent(code)
    bind = f'mount --bind {own} {shared} && exec {sys.executable} -c "$0"'
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", bind,
                        script], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_hosts_at_one_path_never_share_or_free_each_others_ranges(place) -> None:
    registry, shared, a, b = place
    (base_a,) = as_host(a, shared, registry, "print(pool.allocate('sbx-of-a'))")
    base_b, held, freed = as_host(
        b,
        shared,
        registry,
        """
        base = pool.allocate('sbx-of-b')
        print(base, sorted(pool.held().values()), pool.release_orphans())
    """,
    )
    assert base_a != base_b  # two live sandboxes, two host identities
    assert held == "['sbx-of-b']"  # the other host's sandbox is not this data dir's
    assert freed == "0"  # nor an orphan: its entry was made in another mount namespace
    assert instance.read(a) != instance.read(b)
    # Here (a third namespace, nothing bound at the path) neither is judged either.
    assert UidPool(registry, shared, UID_BASE, 8, True).release_orphans() == 0
    assert sorted(os.listdir(registry)) == sorted([base_a, base_b])


def test_a_removed_data_dir_frees_its_ranges_and_one_made_anew_keeps_them(place) -> None:
    registry, shared, _, _ = place
    pool = UidPool(registry, shared, UID_BASE, 8, True)
    first = pool.allocate("sbx-1")
    (shared / instance.FILE).unlink()  # a data dir made anew at the path: another identity,
    pool = UidPool(registry, shared, UID_BASE, 8, True)  # (its server started again)
    pool.allocate("sbx-2")
    assert list(pool.held().values()) == ["sbx-2"]  # the first entry is not of it
    assert pool.release_orphans() == 0  # kept: it may be another host's storage at this path
    (shared / instance.FILE).unlink()
    shared.rmdir()  # the data dir removed: both its identities' ranges are free
    assert pool.release_orphans() == 2 and not (registry / str(first)).exists()


def test_an_entry_of_before_instance_ids_is_still_its_data_dirs(place) -> None:
    registry, shared, _, _ = place
    registry.mkdir()
    pool = UidPool(registry, shared, UID_BASE, 8, True)
    legacy = pool.base(3)
    (registry / str(legacy)).write_text(f"{shared.resolve()}\nsbx-legacy\n")
    assert pool.held() == {legacy: "sbx-legacy"}
    assert pool.release_orphans() == 0  # its data dir is there
    pool.release(legacy, "sbx-legacy")
    assert not (registry / str(legacy)).exists()


def test_threads_making_a_data_dirs_id_at_once_agree(place) -> None:
    """Parallel creates of one server make the id from several threads at once."""
    _, shared, _, _ = place
    got: list[str] = []

    def make() -> None:
        got.append(instance.ensure(shared))

    threads = [threading.Thread(target=make) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and len(set(got)) == 1
    assert [p.name for p in shared.iterdir()] == [instance.FILE]  # no temporary file left
