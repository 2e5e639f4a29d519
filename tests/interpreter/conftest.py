"""The code interpreter end to end: the official, unmodified e2b-code-interpreter SDK talks to a
real ``sandhold serve`` (both planes on one port), which creates real sandboxes from the
``code-interpreter-v1`` template and forwards port 49999 through the agent's CONNECT tunnel.
The agent starts the interpreter at boot (the template's ``services``).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
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


@pytest.fixture(scope="session")
def interp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InterpreterServer]:
    data_dir = Path(tempfile.mkdtemp(prefix="sandhold-interp-", dir="/var/tmp"))
    data_dir.chmod(0o755)  # the sandboxes' unprivileged owner must traverse it
    srv = InterpreterServer(data_dir, listen(), tmp_path_factory.mktemp("interp") / "server.log")
    try:
        srv.build_template()
        srv.start()
        yield srv
    finally:
        srv.destroy()


SandboxFactory = Callable[..., Sandbox]


@pytest.fixture(scope="module")
def make_sandbox(interp: InterpreterServer) -> Iterator[SandboxFactory]:
    """Creates code-interpreter sandboxes through the server; kills them after the module."""
    created: list[Sandbox] = []

    def make(**kw: object) -> Sandbox:
        kw.setdefault("timeout", 900)
        sbx = Sandbox.create(
            api_key=API_KEY, api_url=interp.url, sandbox_url=interp.sandbox_url, **kw
        )
        created.append(sbx)
        interp.ready(sbx)
        return sbx

    yield make
    for sbx in created:
        try:
            sbx.kill()
        except Exception:
            pass


@pytest.fixture(scope="module")
def sbx(make_sandbox: SandboxFactory) -> Sandbox:
    """One sandbox shared by the tests of a module that do not disturb each other."""
    return make_sandbox()
