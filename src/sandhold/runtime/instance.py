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
    """The id of ``data_dir``, made on first use. Two makers at once agree: each writes its own
    temporary file and links it into place, and the loser reads the winner's."""
    if (found := read(data_dir)) is not None:
        return found
    data_dir.mkdir(parents=True, exist_ok=True)
    made = secrets.token_hex(8)
    tmp = data_dir / f".{FILE}.{made}.tmp"  # its own name: threads of one process race too
    tmp.write_text(made + "\n")
    try:
        with contextlib.suppress(FileExistsError):
            os.link(tmp, data_dir / FILE)
    finally:
        tmp.unlink()
    found = read(data_dir)
    assert found is not None
    return found
