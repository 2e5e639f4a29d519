"""`sandhold serve` start-up rules: no API keys means loopback only, and then any key works."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from e2b import Sandbox

from tests.support.e2b_server import new_server


def test_refuses_an_open_api_on_a_public_address(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_")}
    env["SANDHOLD_DATA_DIR"] = str(tmp_path / "data")
    r = subprocess.run(
        [sys.executable, "-m", "sandhold.cli", "serve", "--host", "0.0.0.0", "--port", "1"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 78  # ConfigError (sandhold.cli.errors)
    assert "refusing to listen on 0.0.0.0" in r.stderr and "SANDHOLD_API_KEYS" in r.stderr


def test_an_inherited_socket_is_judged_by_its_own_address(tmp_path: Path) -> None:
    """With --fd the rule looks at the socket's real address, not at --host or server_host."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_")}
    env["SANDHOLD_DATA_DIR"] = str(tmp_path / "data")

    def serve(fd: int) -> subprocess.CompletedProcess[str]:
        argv = ["serve", "--host", "127.0.0.1", "--fd", str(fd)]
        cmd = [sys.executable, "-m", "sandhold.cli", *argv]
        return subprocess.run(cmd, env=env, pass_fds=(fd,), capture_output=True, text=True,
                              timeout=60)  # fmt: skip

    with socket.socket() as public:
        public.bind(("0.0.0.0", 0))
        public.listen()
        r = serve(public.fileno())
    assert r.returncode == 78  # ConfigError (sandhold.cli.errors)
    assert "refusing to listen on 0.0.0.0" in r.stderr and "SANDHOLD_API_KEYS" in r.stderr
    with open(tmp_path / "not-a-socket", "w") as f:
        r = serve(f.fileno())
    assert r.returncode == 65 and "is not an open socket" in r.stderr  # InvalidRequest
    with socket.socket() as unlistened:
        unlistened.bind(("127.0.0.1", 0))
        r = serve(unlistened.fileno())
    assert r.returncode == 65 and "is not a listening stream socket" in r.stderr


def test_without_keys_any_key_works_on_loopback(tmp_path: Path) -> None:
    srv = new_server(tmp_path, api_keys=json.dumps({}))
    srv.start()
    try:
        s = Sandbox.create(api_key="anything-at-all", api_url=srv.url, sandbox_url=srv.url)
        assert s.commands.run("echo open").stdout == "open\n"
        other = Sandbox.get_info(s.sandbox_id, api_key="another", api_url=srv.url)
        assert other.sandbox_id == s.sandbox_id  # one team for everyone
        s.kill()
    finally:
        srv.destroy()
