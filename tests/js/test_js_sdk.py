"""The official E2B JavaScript SDKs (``e2b`` and ``@e2b/code-interpreter`` from npm, pinned in
tests/js/package.json, installed by ``scripts/install.sh --test``) against a live `sandhold
serve` holding the code-interpreter template: each ``*.test.mjs`` here runs under node's own
test runner, with the environment docs/e2b.md tells users to set."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.e2b_server import e2b_env
from tests.support.interpreter import API_KEY, InterpreterServer, interpreter_server

HERE = Path(__file__).parent
SUITES = sorted(p.name for p in HERE.glob("*.test.mjs"))
SUITE_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InterpreterServer]:
    if not (HERE / "node_modules" / "e2b").is_dir():
        pytest.fail("the JavaScript SDKs are not installed: scripts/install.sh --test")
    with interpreter_server(tmp_path_factory.mktemp("js") / "server.log") as srv:
        yield srv


@pytest.mark.parametrize("suite", SUITES)
def test_suite(server: InterpreterServer, suite: str) -> None:
    node = shutil.which("node")
    assert node is not None, "node is not installed: scripts/install.sh"
    env = e2b_env(server.url, API_KEY)
    r = subprocess.run(
        [node, "--test", "--test-reporter=spec", suite],
        cwd=HERE,
        env=env,
        capture_output=True,
        text=True,
        timeout=SUITE_TIMEOUT_S,
    )
    assert r.returncode == 0, f"{suite} failed:\n{r.stdout[-20000:]}\n{r.stderr[-5000:]}"
