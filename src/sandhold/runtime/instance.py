"""This data dir's identity: a random id written once in ``<data_dir>/instance``.

A data dir's path says nothing about which one it is: two hosts of a fleet (pods with a volume
each, mounted at the same path) have the same path and different data. Host-wide records that
name a data dir (the uid registry, ``uids.py``) name it by this id.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

FILE = "instance"


def read(data_dir: Path) -> str | None:
    """The id of ``data_dir``, or None if it has none (yet)."""
    try:
        return (data_dir / FILE).read_text().strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None


def ensure(data_dir: Path) -> str:
    """The id of ``data_dir``, made on first use. Two processes making it at once agree: it is
    written under a temporary name and linked into place, and the loser reads the winner's."""
    if (found := read(data_dir)) is not None:
        return found
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = data_dir / f".{FILE}.{os.getpid()}.tmp"
    tmp.write_text(secrets.token_hex(8) + "\n")
    try:
        with contextlib.suppress(FileExistsError):
            os.link(tmp, data_dir / FILE)
    finally:
        tmp.unlink()
    found = read(data_dir)
    assert found is not None
    return found
