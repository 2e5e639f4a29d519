"""`sandhold worker` processes (``Worker``) between the stand-in control plane
(tests/worker/control_plane.py) and a real gateway, and what the worker tests read back from the
gateway: a session's sandbox (``sandbox_of``), its workspace (``workspace``), a tool result's
text (``text_of``); ``POLICY``, the tenant's policy on the worker tests' gateway."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from tests.support.gateway_server import Gateway

# Sandboxes stay up for the whole module: recovery must find the session's own sandbox.
POLICY = {"keep_alive_s": 300, "retention_s": 600, "max_command_timeout_s": 200}


class Worker:
    """One `sandhold worker` process."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sandhold.cli", "worker", *args], env=env,
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def sandbox_of(gateway: Gateway, session_id: str) -> str | None:
    """The session's sandbox as the gateway records it."""
    with gateway.client() as c:
        rows = c.get("/v1/sessions").json()
    return next((r["sandbox_id"] for r in rows if r["session_id"] == session_id), None)


def text_of(result: dict[str, object]) -> str:
    """The text of a tool result event's content blocks."""
    blocks = result["content"]
    assert isinstance(blocks, list)
    return "\n".join(str(b["text"]) for b in blocks if b["type"] == "text")


def workspace(gateway: Gateway, session_id: str) -> Path:
    return gateway.workspaces / "acme" / session_id
