"""The E2B CLI (``@e2b/cli`` from npm, pinned in tests/js/package.json) against a live `sandhold
serve`, as a new user would run it (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY): the sandbox
commands (list, info, logs, metrics, exec, pause, resume, snapshots, kill) and the template ones
(create from a Dockerfile, list, publish, unpublish, delete). docs/e2b.md lists them."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox

from tests.support.e2b_server import KEY_A, Server, e2b_env, new_server

CLI = Path(__file__).parent / "node_modules" / ".bin" / "e2b"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    if not CLI.exists():
        pytest.fail("the E2B CLI is not installed: scripts/install.sh --test")
    srv = new_server(tmp_path_factory.mktemp("cli"))
    srv.start()
    yield srv
    srv.destroy()


@pytest.fixture
def e2b(server: Server, tmp_path: Path):  # type: ignore[no-untyped-def]
    env = e2b_env(server.url, KEY_A)
    env.update(NO_COLOR="1", HOME=str(tmp_path))  # (the CLI's own config lives in HOME: none)

    def run(*args: str, cwd: Path = tmp_path) -> str:
        r = subprocess.run(
            [str(CLI), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
        )
        assert r.returncode == 0, f"e2b {' '.join(args)}: {r.stdout[-3000:]}{r.stderr[-3000:]}"
        return r.stdout

    return run


def test_the_sandbox_commands(server: Server, e2b) -> None:  # type: ignore[no-untyped-def]
    sbx = Sandbox.create(timeout=300, **server.sdk())
    try:
        sbx.commands.run("echo hi")
        assert sbx.sandbox_id in e2b("sandbox", "list")
        listed = json.loads(e2b("sandbox", "list", "--format", "json"))
        assert [s["state"] for s in listed if s["sandboxId"] == sbx.sandbox_id] == ["running"]
        assert f"Sandbox ID: {sbx.sandbox_id}" in e2b("sandbox", "info", sbx.sandbox_id)
        logs = e2b("sandbox", "logs", sbx.sandbox_id)
        assert "started (user): /bin/bash -l -c echo hi" in logs, logs
        assert "Memory:" in e2b("sandbox", "metrics", sbx.sandbox_id)
        assert e2b("sandbox", "exec", sbx.sandbox_id, "echo", "from-exec").strip() == "from-exec"

        assert "has been paused" in e2b("sandbox", "pause", sbx.sandbox_id)
        assert sbx.get_info().state.value == "paused"
        assert "has been resumed" in e2b("sandbox", "resume", sbx.sandbox_id)
        assert sbx.commands.run("echo back").stdout == "back\n"

        e2b("sandbox", "snapshot", "create", sbx.sandbox_id)
        snaps = json.loads(e2b("sandbox", "snapshot", "list", "--format", "json"))
        ids = [s["snapshotId"] for s in snaps]
        assert len(ids) == 1, snaps
        e2b("sandbox", "snapshot", "delete", ids[0])
        assert json.loads(e2b("sandbox", "snapshot", "list", "--format", "json")) == []

        assert "has been killed" in e2b("sandbox", "kill", sbx.sandbox_id)
        assert sbx.sandbox_id not in e2b("sandbox", "list")
    finally:
        sbx.kill()


def test_the_template_commands(server: Server, e2b, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "Dockerfile").write_text(
        "FROM e2bdev/base\nRUN echo built > /home/user/built.txt\n"
    )
    out = e2b("template", "create", "cli-built", "--path", str(tmp_path))
    assert "Building sandbox template cli-built finished" in out, out
    assert "cli-built" in e2b("template", "list")
    sbx = Sandbox.create("cli-built", **server.sdk())
    try:
        assert sbx.files.read("/home/user/built.txt") == "built\n"
    finally:
        sbx.kill()
    e2b("template", "publish", "cli-built", "--yes")
    assert "Public" in next(r for r in e2b("template", "list").splitlines() if "cli-built" in r)
    e2b("template", "unpublish", "cli-built", "--yes")
    e2b("template", "delete", "cli-built", "--yes")
    assert "cli-built" not in e2b("template", "list")
