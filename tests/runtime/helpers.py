from __future__ import annotations

from sandhold.runtime.client import AgentClient, CommandResult
from sandhold.runtime.runtime import SandboxInfo


async def sh(info: SandboxInfo, cmd: str, user: str | None = None, **kw: object) -> CommandResult:
    """Run ``cmd`` with bash inside the sandbox through its agent."""
    async with AgentClient(info.agent_socket, timeout=120) as client:
        return await client.run(cmd, user=user, **kw)  # type: ignore[arg-type]


async def py(info: SandboxInfo, code: str, user: str | None = None) -> CommandResult:
    """Run Python code inside the sandbox (passed on stdin-free argv, quoted by bash)."""
    import shlex

    return await sh(info, f"python3 -c {shlex.quote(code)}", user=user)
