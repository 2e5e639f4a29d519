"""The deployment CA (egress/ca.py) made by many at once: two template builds' first egress at
once raced on its files and one failed (found by tests/compat). Every maker now gets the one CA."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sandhold.egress.ca import DeploymentCA


def _fingerprint(directory: str) -> bytes:
    return DeploymentCA(Path(directory)).cert_pem()


def test_many_makers_at_once_get_one_ca(tmp_path: Path) -> None:
    threads = tmp_path / "threads"
    with ThreadPoolExecutor(8) as pool:
        made = list(pool.map(_fingerprint, [str(threads)] * 16))
    assert len(set(made)) == 1

    processes = tmp_path / "processes"
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        made = pool.map(_fingerprint, [str(processes)] * 8)
    assert len(set(made)) == 1
    assert (processes / "ca.key").stat().st_mode & 0o077 == 0
    leftovers = [p.name for p in processes.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
