"""A throw-away PostgreSQL server for the multi-replica and migration tests: initdb into a temp
dir and pg_ctl start as the `postgres` OS user (initdb refuses root), listening on a unix socket
in that dir only (``listen_addresses=''``): no TCP port is involved, so none can be taken."""

from __future__ import annotations

import glob
import shutil
import subprocess
import tempfile
from pathlib import Path

from sqlalchemy import create_engine, text


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
    return found[-1]


class Postgres:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="sandhold-pg-", dir="/var/tmp"))
        self.data = self.dir / "data"
        shutil.chown(self.dir, "postgres", "postgres")

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@/postgres?host={self.dir}"

    def database(self, name: str) -> str:
        """Create an empty database ``name`` on this server; returns its URL."""
        admin = create_engine(self.url, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
        finally:
            admin.dispose()
        return f"postgresql+psycopg://postgres@/{name}?host={self.dir}"

    def _as_postgres(self, *argv: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *argv], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)  # fmt: skip

    def start(self) -> None:
        self._as_postgres(_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                          "--no-sync", "-E", "UTF8")  # fmt: skip
        opts = (f"-k {self.dir} -c listen_addresses='' -c fsync=off "
                "-c synchronous_commit=off -c max_connections=300")  # fmt: skip
        self._as_postgres(_bin("pg_ctl"), "-D", str(self.data), "-o", opts, "-w",
                          "-l", str(self.dir / "postgres.log"), "start")  # fmt: skip

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._as_postgres(_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
