"""The agent's start-up configuration (``--config FILE``, written by the host)."""

from __future__ import annotations

import json
from typing import Any


class AgentConfig:
    def __init__(
        self,
        socket: str,
        default_user: str = "user",
        default_workdir: str | None = None,
        env: dict[str, str] | None = None,
        ready_fd: int | None = None,
        envd_version: str = "0.6.13",
        services: list[dict[str, Any]] | None = None,
        egress: dict[str, Any] | None = None,
        file_view: dict[str, Any] | None = None,
        socket_owned: bool = True,
        root_caps: frozenset[int] = frozenset(),
    ) -> None:
        self.socket = socket
        self.default_user = default_user
        self.default_workdir = default_workdir
        self.env = env if env is not None else {}
        self.ready_fd = ready_fd
        self.envd_version = envd_version
        # Started at boot and kept as tagged background processes, like a template's start
        # command: [{"name", "argv": [...], "env"?: {...}, "user"?: str, "cwd"?: str,
        #   "port"?: int, "env_path"?: str (where the service takes the sandbox's env after a
        #   warm start)}]
        self.services = services if services is not None else []
        # {"socket", "proxy_port", "dns_port"} when the sandbox has egress (see egress.py)
        self.egress = egress
        # {"read": [...], "write": [...], "read_only": [...]}: what the file API may touch
        # view.py
        self.file_view = file_view
        # Whether the agent bound ``socket`` itself (and removes it when it stops); in a
        # sandbox the host binds it and hands over the listening descriptor.
        self.socket_owned = socket_owned
        # Capabilities (numbers) its root processes keep, in its user namespace: a build
        # sandbox's (runtime/templates/build.py); every other sandbox's root has none.
        self.root_caps = root_caps

    @classmethod
    def load(cls, source: str | int) -> AgentConfig:
        """From a file, or a descriptor (read, then closed)."""
        path = source if isinstance(source, str) else f"fd {source}"
        with open(source, encoding="utf-8") as f:
            return cls.parse(json.load(f), path)

    @classmethod
    def parse(cls, raw: object, path: str = "the configuration") -> AgentConfig:
        if not isinstance(raw, dict) or not isinstance(raw.get("socket"), str):
            raise ValueError(f"{path}: a JSON object with a 'socket' path is required")
        env = raw.get("env") or {}
        if not isinstance(env, dict):
            raise ValueError(f"{path}: 'env' must be an object")
        ready_fd = raw.get("ready_fd")
        services = raw.get("services") or []
        if not isinstance(services, list) or not all(
            isinstance(svc, dict)
            and isinstance(svc.get("argv"), list)
            and svc["argv"]
            and all(isinstance(a, str) for a in svc["argv"])
            for svc in services
        ):
            raise ValueError(f"{path}: 'services' must be a list of objects with an 'argv' list")
        return cls(
            socket=raw["socket"],
            default_user=str(raw.get("default_user") or "user"),
            default_workdir=raw.get("default_workdir") or None,
            env={str(k): str(v) for k, v in env.items()},
            ready_fd=int(ready_fd) if ready_fd is not None else None,
            envd_version=str(raw.get("envd_version") or "0.6.13"),
            services=services,
            egress=raw.get("egress") if isinstance(raw.get("egress"), dict) else None,
            file_view=raw.get("file_view") if isinstance(raw.get("file_view"), dict) else None,
            root_caps=frozenset(int(c) for c in raw.get("root_caps") or []),
        )


IDENTITY = "/run/sandbox-handoff/identity.json"  # written by the host at every boot


def identity_env() -> dict[str, str]:
    """E2B's ``E2B_SANDBOX``, ``E2B_SANDBOX_ID`` and ``E2B_TEMPLATE_ID`` of this sandbox: read
    each time (a fork or a warm start is this process restored under another id)."""
    try:
        with open(IDENTITY, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return {}  # an agent on a host: the tests'
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
