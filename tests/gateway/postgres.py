"""A throw-away PostgreSQL server for the multi-replica tests: initdb into a temp dir and
pg_ctl start on a unix socket, as the `postgres` OS user (initdb refuses root)."""

from __future__ import annotations

import glob
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.e2b.conftest import free_port


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
    return found[-1]


class Postgres:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="sandhold-pg-", dir="/var/tmp"))
        self.data = self.dir / "data"
        self.port = free_port()
        shutil.chown(self.dir, "postgres", "postgres")

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@/postgres?host={self.dir}&port={self.port}"

    def _as_postgres(self, *argv: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *argv], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)  # fmt: skip

    def start(self) -> None:
        self._as_postgres(_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                          "--no-sync", "-E", "UTF8")  # fmt: skip
        opts = (f"-p {self.port} -k {self.dir} -c listen_addresses='' -c fsync=off "
                "-c synchronous_commit=off -c max_connections=300")  # fmt: skip
        self._as_postgres(_bin("pg_ctl"), "-D", str(self.data), "-o", opts, "-w",
                          "-l", str(self.dir / "postgres.log"), "start")  # fmt: skip

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._as_postgres(_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
