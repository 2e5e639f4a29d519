"""The code interpreter's tests' server (``InterpreterServer``): a real ``sandhold serve`` (both
planes on one port) over a data dir holding the ``code-interpreter-v1`` template, built from the
wheels and package tree cached across sessions (``CACHE_DIR``), for the official, unmodified
e2b-code-interpreter SDK (``API_KEY``; ``SandboxFactory``, what the ``make_sandbox`` fixture of
tests/interpreter yields)."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
from e2b_code_interpreter import Sandbox

from sandhold.config import Settings
from sandhold.interpreter.template import SERVICE_PORT, build_code_interpreter_template
from sandhold.runtime.templates.store import TemplateStore
from tests.support.e2b_server import KEY_A, Server, listen

API_KEY = KEY_A  # the e2b suite's server configuration: key -> team-a
# Wheels and the installed package tree survive test sessions (each session has a fresh data
# dir): only the very first run on a machine downloads and installs.
CACHE_DIR = Path(os.environ.get("SANDHOLD_TEST_CACHE", "/var/tmp/sandhold-cache")) / "interpreter"


class InterpreterServer(Server):
    """`sandhold serve` over a data dir holding the code-interpreter template."""

    build_seconds = 0.0

    @property
    def sandbox_url(self) -> str:
        return self.url  # one port for both planes, as docs/e2b.md tells users

    def build_template(self) -> None:
        t0 = time.monotonic()
        store = TemplateStore(
            self.data_dir / "templates", Settings(data_dir=self.data_dir).uid_base
        )
        build_code_interpreter_template(store, cache_dir=CACHE_DIR)
        self.build_seconds = time.monotonic() - t0

    # -- per sandbox ------------------------------------------------------------------------
    def _health(self, sbx: Sandbox, base: str) -> bool:
        headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": str(SERVICE_PORT)}
        if sbx.traffic_access_token:
            headers["E2B-Traffic-Access-Token"] = sbx.traffic_access_token
        try:
            r = httpx.get(f"{base}/health", headers=headers, timeout=30)
        except httpx.TransportError:
            return False
        return r.status_code == 200

    def ready(self, sbx: Sandbox) -> None:
        """The agent starts the interpreter at boot and its tunnel waits for it: nothing to do
        but check the route answers."""
        if not self._health(sbx, self.sandbox_url):
            raise AssertionError("the interpreter is not reachable through the server")


SandboxFactory = Callable[..., Sandbox]


@contextlib.contextmanager
def interpreter_server(log: Path) -> Iterator[InterpreterServer]:
    """An ``InterpreterServer`` started over a fresh data dir (its template built, from the
    cache), destroyed afterwards whatever failed."""
    data_dir = Path(tempfile.mkdtemp(prefix="sandhold-interp-", dir="/var/tmp"))
    data_dir.chmod(0o755)  # the sandboxes' unprivileged owner must traverse it
    srv = InterpreterServer(data_dir, listen(), log)
    try:
        srv.build_template()
        srv.start()
        yield srv
    finally:
        srv.destroy()
