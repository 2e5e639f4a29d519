"""`sandhold session ...` as a real process: a data dir without a gateway store, a file that is
not one, a store of another schema revision and an unreachable database are each one clear line
with its sysexits status (cli/errors.py), never a traceback; nothing is created on the way."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandhold.store.db import make_engine
from sandhold.store.schema import run_migrations

COMMANDS = [("ls",), ("timeline", "conv-1"), ("stats", "acme")]


def session_cli(data_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_")}
    return subprocess.run(
        [sys.executable, "-m", "sandhold.cli", "session", *args], capture_output=True, text=True,
        env={**base, "SANDHOLD_DATA_DIR": str(data_dir), **env}, timeout=120,
    )  # fmt: skip


def assert_clear(r: subprocess.CompletedProcess[str], status: int, text: str) -> None:
    assert r.returncode == status, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout and len(r.stderr.strip().splitlines()) == 1
    assert text in r.stderr, r.stderr


@pytest.fixture
def store_file(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "gateway").mkdir()
    yield tmp_path / "gateway" / "gateway.db"


@pytest.mark.parametrize("args", COMMANDS)
def test_no_gateway_store(tmp_path: Path, args: tuple[str, ...]) -> None:
    r = session_cli(tmp_path, *args)
    assert_clear(r, 66, f"no gateway store at {tmp_path / 'gateway' / 'gateway.db'}")
    assert "sandhold gateway serve" in r.stderr
    assert list(tmp_path.iterdir()) == []  # no database file made on the way


def test_a_file_that_is_no_store_and_an_old_schema(tmp_path: Path, store_file: Path) -> None:
    store_file.touch()
    assert_clear(session_cli(tmp_path, "ls"), 66, "holds no gateway store")
    store_file.unlink()
    engine = make_engine(f"sqlite:///{store_file}")
    try:
        run_migrations(engine, "upgrade", "0001")
    finally:
        engine.dispose()
    r = session_cli(tmp_path, "timeline", "conv-1")
    assert_clear(r, 73, "has schema revision 0001")  # Conflict: migrate it first


def test_an_unreachable_database(tmp_path: Path) -> None:
    with socket.socket() as sock:  # bound, never listening: connections are refused
        sock.bind(("127.0.0.1", 0))
        url = f"postgresql+psycopg://u:pw-not-shown@127.0.0.1:{sock.getsockname()[1]}/db"
        r = session_cli(tmp_path, "ls", SANDHOLD_GATEWAY_STORE_URL=url)
    assert_clear(r, 75, "cannot read the gateway store")  # Unavailable: try again later
    assert "pw-not-shown" not in r.stderr


def test_a_store_at_head_is_read(tmp_path: Path, store_file: Path) -> None:
    engine = make_engine(f"sqlite:///{store_file}")
    try:
        run_migrations(engine)
    finally:
        engine.dispose()
    r = session_cli(tmp_path, "ls")
    assert r.returncode == 0 and "session" in r.stdout, r.stderr
    assert_clear(session_cli(tmp_path, "timeline", "conv-1"), 66, "'conv-1' does not exist")
