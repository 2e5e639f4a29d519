from __future__ import annotations

from sandhold.runtime.client import AgentClient, CommandOutput
from sandhold.runtime.runtime import SandboxInfo


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
