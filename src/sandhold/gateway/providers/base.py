"""The provider interface: what the gateway needs from a sandbox backend, and what it may assume.

A provider declares its ``Capabilities``; the session manager adapts to them (e.g. it falls back
to a re-read before killing when the provider cannot delete conditionally) instead of assuming.
"""

from __future__ import annotations

import abc
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sandhold.egress.policy import EgressPolicy
from sandhold.envd.transports import Channel
from sandhold.errors import NeedsNewSandbox, PreconditionFailed, ProviderError, SandboxGone

State = Literal["running", "paused", "pausing"]
__all__ = ["Channel", "NeedsNewSandbox", "PreconditionFailed", "ProviderError", "SandboxGone"]


@dataclass(frozen=True)
class Capabilities:
    pause_keeps_memory: bool  # a resumed sandbox has its processes and /tmp back
    # A long-paused sandbox leaves memory: whoever runs it checkpoints it to disk (processes
    # gone, memory freed) and resume restores it, processes and memory. The gateway needs to do
    # nothing for it (it never touches a paused sandbox but to resume it for a call, or kill it).
    suspends_to_disk: bool
    snapshots: bool  # named snapshots of a sandbox can be taken and created from (the backend's)
    fork: bool  # a running sandbox can be forked into independent copies (the backend's)
    auto_resume: bool  # traffic to a paused sandbox resumes it
    mount_workspace: bool  # a host directory (the session's workspace) can be bound at /workspace
    conditional_delete: bool  # kill only if still paused with the endAt we saw
    idle_timeout: bool  # `timeout` counts idle seconds (CubeSandbox), not an absolute end
    per_sandbox_limits: bool  # memory/CPU/pids can be set per create (else: the template's)

    def public(self) -> dict[str, bool]:
        return dict(self.__dict__)


@dataclass
class ProviderSandbox:
    """What the provider says about a sandbox: the only lifecycle truth the gateway uses."""

    id: str
    state: State
    end_at: float | None  # running: when it times out; paused: when it was paused
    started_at: float
    metadata: dict[str, str] = field(default_factory=dict)
    # Set when its agent died (where the provider can tell): it is "paused" for good then, and
    # its end_at is when it failed.
    failure: str | None = None
    # Paused and suspended to disk (no process, no memory; resume restores it), where the
    # provider can tell: the local provider and a Sandhold server.
    suspended: bool = False

    def public(self) -> dict[str, Any]:
        out = {
            "id": self.id,
            "state": self.state,
            "end_at": self.end_at,
            "started_at": self.started_at,
        }
        if self.failure is not None:
            out["failure"] = self.failure
        if self.suspended:
            out["suspended"] = "disk"
        return out


@dataclass
class CreateRequest:
    template: str
    timeout_s: int
    metadata: dict[str, str]
    env: dict[str, str]
    workspace_dir: Path | None
    memory_mb: int
    cpu: float
    pids: int
    tenant: str  # whose secrets the egress proxy injects (where the provider lets us choose)
    network: EgressPolicy = field(default_factory=EgressPolicy)
    # Read-only host directories of the session's view: (real host path, sandbox path).
    views: list[tuple[Path, str]] = field(default_factory=list)
    # What the sandbox's own file API may touch, {"read": [...], "write": [...]} (where the
    # provider can enforce it: the runtime's FileView).
    file_view: dict[str, list[str]] | None = None
    # The workspace's disk budget (MiB; None: uncapped), where the provider can enforce it.
    workspace_disk_mb: int | None = None


class Provider(abc.ABC):
    name: str
    capabilities: Capabilities

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Prepare (e.g. warm templates); called once before the first request."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release clients and background tasks; sandboxes are left as they are."""

    @abc.abstractmethod
    async def create(self, req: CreateRequest) -> tuple[ProviderSandbox, dict[str, Any]]:
        """Create a running sandbox with on_timeout=pause and auto_resume; returns it and a
        small JSON handle (tokens the provider gives only at create) to store with the session."""

    @abc.abstractmethod
    async def connect(self, sandbox_id: str, timeout_s: int) -> tuple[bool, dict[str, Any]]:
        """Make sure the sandbox runs for at least ``timeout_s`` more seconds, resuming it if
        paused; returns (resumed, fresh handle values). Raises SandboxGone."""

    @abc.abstractmethod
    async def set_timeout(self, sandbox_id: str, timeout_s: int) -> None:
        """Set the sandbox's remaining time (its keep-alive); a gone sandbox is ignored."""

    @abc.abstractmethod
    async def update_network(self, sandbox_id: str, tenant: str, network: EgressPolicy) -> None:
        """Replace a live sandbox's egress rules (its next connection is judged by them).
        Raises SandboxGone, or NeedsNewSandbox when the sandbox cannot take them."""

    @abc.abstractmethod
    async def get(self, sandbox_id: str) -> ProviderSandbox | None:
        """The sandbox's current state, or None if it does not exist."""

    def known_running_for(self, sandbox_id: str) -> float:
        """For how many more seconds the provider knows, without asking anyone, that the sandbox
        runs (it set its end itself); 0: it does not know. The manager then connects without
        reading its state first, or not at all when that outlasts the call. 0 unless the
        provider can be sure (the local one: see local.py)."""
        return 0.0

    @abc.abstractmethod
    async def list(self, metadata: dict[str, str]) -> list[ProviderSandbox]:
        """Every sandbox (running and paused) whose metadata has all the given pairs."""

    @abc.abstractmethod
    async def kill(self, sandbox_id: str, if_paused_end_at: float | None = None) -> bool:
        """Kill a sandbox; False if it was already gone. With ``if_paused_end_at`` (only when
        ``capabilities.conditional_delete``) the kill happens only if the sandbox is still
        paused with that endAt, else PreconditionFailed."""

    @abc.abstractmethod
    def channel(
        self, sandbox_id: str, handle: dict[str, Any], port: int
    ) -> contextlib.AbstractAsyncContextManager[Channel]:
        """An HTTP channel to ``port`` inside the sandbox (``sandhold.envd`` names the ports)."""
