from __future__ import annotations

import subprocess
import sys

from sandhold.runtime.client import AgentClient, CommandOutput
from sandhold.runtime.runtime import Runtime, SandboxInfo


async def sh(
    info: SandboxInfo, cmd: str, user: str | None = None, timeout: float | None = None
) -> CommandOutput:
    """Run ``cmd`` with bash inside the sandbox through its agent."""
    async with AgentClient(info.agent_socket, timeout=120) as client:
        return await client.sh(cmd, user=user, timeout_s=timeout)


async def py(info: SandboxInfo, code: str, user: str | None = None) -> CommandOutput:
    """Run Python code inside the sandbox (passed on stdin-free argv, quoted by bash)."""
    import shlex

    return await sh(info, f"python3 -c {shlex.quote(code)}", user=user)


def sh_sync(info: SandboxInfo, cmd: str, user: str | None = None) -> CommandOutput:
    """``sh`` for code without an event loop of its own (scripts run by tests)."""
    import asyncio

    return asyncio.run(sh(info, cmd, user=user))


def state_from_another_pid_namespace(runtime: Runtime, sandbox_id: str, timeout: float) -> str:
    """The sandbox's state as a runtime over the same data dir reads it from a PID namespace
    of its own (``sandhold sandbox ls`` outside a pod's namespace, or a server inside one)."""
    probe = (
        "from sandhold.config import Settings; from sandhold.runtime.runtime import Runtime; "
        f"print(Runtime(Settings(data_dir='{runtime.settings.data_dir}')).get('{sandbox_id}').state)"
    )
    r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", probe],
                       capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()
