"""The agent as a real process, exactly as a sandbox starts it, talked to over its unix socket
(``start_agent``, yielding an ``AgentHandle``): ``/usr/bin/python3 -I -S
<lib>/sandhold/agent/__main__.py --config <file>`` where ``<lib>`` is a throw-away directory with
``sandhold`` and ``h11`` symlinked in, the same layout as ``/opt/sandhold/lib`` inside a
sandbox. On the host the agent runs as root, with ``root`` as its default user."""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h11
import httpx

import sandhold

REPO_SRC = Path(sandhold.__file__).resolve().parent
PYTHON = "/usr/bin/python3"


@dataclass
class AgentHandle:
    client: httpx.AsyncClient
    socket_path: str
    workdir: Path  # a scratch directory on the agent's filesystem, for tests to use
    pid: int
    config: dict[str, Any]


def _make_lib(root: Path) -> Path:
    lib = root / "lib"
    lib.mkdir()
    (lib / "sandhold").symlink_to(REPO_SRC)
    (lib / "h11").symlink_to(Path(h11.__file__).resolve().parent)
    return lib


@contextlib.asynccontextmanager
async def start_agent(lib: Path | None = None, **overrides: Any) -> AsyncIterator[AgentHandle]:
    """Start an agent (config keys may be overridden) and yield a handle to it; from the source
    tree, or from ``lib`` (a copy the runtime built, with the agent's compiled parts)."""
    root = Path(tempfile.mkdtemp(prefix="sh-agent-", dir="/tmp"))
    os.chmod(root, 0o755)
    lib = lib or _make_lib(root)
    work = root / "work"
    work.mkdir()
    os.chmod(work, 0o777)  # other users get to write here in user-switch tests
    sock = str(root / "agent.sock")
    ready_r, ready_w = os.pipe()
    config = {
        "socket": sock,
        "default_user": "root",
        "default_workdir": None,
        "env": {"SANDHOLD_TEST": "1"},
        "ready_fd": ready_w,
        "envd_version": "0.6.13",
        **overrides,
    }
    (root / "agent.json").write_text(json.dumps(config))
    log = open(root / "agent.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [PYTHON, "-I", "-S", str(lib / "sandhold/agent/__main__.py"),
         "--config", str(root / "agent.json")],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(ready_w,),
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"},
    )  # fmt: skip
    os.close(ready_w)
    client: httpx.AsyncClient | None = None
    try:
        deadline = time.monotonic() + 10
        if not select.select([ready_r], [], [], max(0.0, deadline - time.monotonic()))[0]:
            raise RuntimeError("agent did not become ready: " + (root / "agent.log").read_text())
        assert os.read(ready_r, 16) == b"ready\n", (root / "agent.log").read_text()
        transport = httpx.AsyncHTTPTransport(uds=sock)
        client = httpx.AsyncClient(transport=transport, base_url="http://sandbox", timeout=30)
        yield AgentHandle(client, sock, work, proc.pid, config)
    finally:
        os.close(ready_r)
        if client is not None:
            await client.aclose()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        if os.environ.get("SANDHOLD_KEEP_AGENT_LOGS"):
            print((root / "agent.log").read_text())
        shutil.rmtree(root, ignore_errors=True)
