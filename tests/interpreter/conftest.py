"""The code interpreter end to end: the official, unmodified e2b-code-interpreter SDK talks to a
real ``sandhold serve`` (both planes on one port), which creates real sandboxes from the
``code-interpreter-v1`` template and forwards port 49999 through the agent's CONNECT tunnel.
The agent starts the interpreter at boot (the template's ``services``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b_code_interpreter import Sandbox

from tests.support.interpreter import (
    API_KEY,
    InterpreterServer,
    SandboxFactory,
    interpreter_server,
)


@pytest.fixture(scope="session")
def interp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InterpreterServer]:
    with interpreter_server(tmp_path_factory.mktemp("interp") / "server.log") as srv:
        yield srv


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
