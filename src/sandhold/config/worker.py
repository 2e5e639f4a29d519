"""The sandbox worker's settings (``sandhold worker``, docs/worker.md). Section ``[worker]``: the
keys are the field names without ``worker_`` (``base_url``, ``environment_id``, ``gateway_url``).

The three settings of the control plane also fall back to the ``anthropic`` SDK's own variables
(``ANTHROPIC_BASE_URL``, ``ANTHROPIC_ENVIRONMENT_ID``, ``ANTHROPIC_ENVIRONMENT_KEY``) when the
``SANDHOLD_WORKER_*`` one is unset: ``resolved_worker`` says which wins."""

from __future__ import annotations

import os
from typing import ClassVar, Literal

from pydantic import Field

from sandhold.config.layer import Layer
from sandhold.errors import ConfigError

# The anthropic SDK's variables, read when the SANDHOLD_WORKER_* setting is unset.
SDK_FALLBACKS = {
    "worker_base_url": "ANTHROPIC_BASE_URL",
    "worker_environment_id": "ANTHROPIC_ENVIRONMENT_ID",
    "worker_environment_key": "ANTHROPIC_ENVIRONMENT_KEY",
}


class WorkerSettings(Layer):
    toml_section: ClassVar[str] = "worker"
    toml_prefix: ClassVar[str] = "worker_"

    worker_base_url: str | None = Field(
        None,
        description="Base URL of the Managed-Agents-compatible control plane (ANTHROPIC_BASE_URL "
        "when unset; the SDK's default, the Anthropic API, when both are).",
    )
    worker_environment_id: str | None = Field(
        None, description="The self-hosted environment served (env_...; ANTHROPIC_ENVIRONMENT_ID)."
    )
    worker_environment_key: str | None = Field(
        None,
        description="The environment's key, which polls its work queue "
        "(ANTHROPIC_ENVIRONMENT_KEY).",
    )
    worker_gateway_url: str = Field(
        "http://127.0.0.1:49990", description="The Sandhold gateway whose sandboxes run the tools."
    )
    worker_gateway_key: str | None = Field(
        None, description="The gateway tenant's API key: every session runs as that tenant."
    )
    worker_id: str | None = Field(
        None, description="Sent on each poll (Anthropic-Worker-ID); host name + random when unset."
    )
    worker_max_idle_s: float = Field(
        60.0,
        gt=0,
        description="Seconds a work item is kept after its session's turn ended, before the "
        "worker stops it and polls again (the SDK's max_idle).",
    )
    worker_max_concurrent_calls: int = Field(
        1,
        ge=1,
        description="Tool calls of one session run at once (the SDK's max_concurrent_calls): "
        "calls of different session threads only; one thread's always run one at a time.",
    )
    worker_custom_tools: Literal["error", "leave"] = Field(
        "error",
        description="Custom tools of the session's agent: answer each call with an is_error "
        "result (no handler here), or leave it pending for another client (the app backend).",
    )
    worker_max_file_bytes: int = Field(
        256 * 1024,
        ge=1,
        description="Largest text file `read` returns whole and `edit` changes (the SDK's "
        "default); a larger one is read with view_range.",
    )
    worker_bash_timeout_s: float = Field(
        120.0,
        gt=0,
        le=140.0,
        description="A bash call's timeout when it names none (the SDK's default); at most 140 s, "
        "under the SDK runner's 150 s bound on every tool call.",
    )
    worker_gateway_timeout_s: float = Field(
        30.0, gt=0, description="HTTP timeout of a gateway call beyond the command's own budget."
    )

    def resolved_worker(self) -> dict[str, str | None]:
        """The control plane's three settings, each from its SANDHOLD_WORKER_* setting or else
        the SDK's variable."""
        return {
            name: getattr(self, name) or os.environ.get(var) or None
            for name, var in SDK_FALLBACKS.items()
        }

    def check_worker(self) -> dict[str, str | None]:
        """Refuse to start a worker that could not serve: no environment, key or gateway key.
        Returns the resolved control-plane settings."""
        resolved = self.resolved_worker()
        for name in ("worker_environment_id", "worker_environment_key"):
            if not resolved[name]:
                flag = "--" + name.removeprefix("worker_").replace("_", "-")
                raise ConfigError(
                    f"sandhold worker needs {name}: set SANDHOLD_{name.upper()} (or "
                    f"{SDK_FALLBACKS[name]}), or pass {flag}"
                )
        if not self.worker_gateway_key:
            raise ConfigError(
                "sandhold worker needs worker_gateway_key: set SANDHOLD_WORKER_GATEWAY_KEY to the "
                "API key of the gateway tenant whose sandboxes run the sessions"
            )
        return resolved
