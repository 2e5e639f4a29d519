"""The ``mcp`` option: its shape (checked by the server at create and by the command again), and
the command each named server runs as.

Standard library only: this module runs on the server and inside the sandbox.

* ``github/<owner>/<repo>`` (the SDK's ``GitHubMcpServerConfig``: ``run_cmd``, optional
  ``install_cmd`` and ``envs``): the repository is cloned with git into
  ``/opt/mcp-gateway/github/<owner>/<repo>`` (reachable only where the sandbox's egress policy
  lets it, or through a git ``url.<base>.insteadOf`` of the template's), ``install_cmd`` runs
  there, then ``run_cmd`` is the stdio server.
* any other name (E2B's catalog: ``filesystem``, ``githubOfficial``, ...): E2B runs a Docker
  image, which cannot run here. A template provides such a server with a registry file,
  ``/etc/mcp-gateway/servers/<name>.json``: ``{"command": [argv...], "env": {...}, "cwd": dir}``;
  ``${config.KEY}`` in an argument or an env value is the server's config value ``KEY``, and
  ``MCP_SERVER_CONFIG`` holds the whole config as JSON. A name without a file is not available.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PORT = 50005
TOKEN_PATH = Path("/etc/mcp-gateway/.token")
REGISTRY_DIR = Path("/etc/mcp-gateway/servers")
WORK_DIR = Path("/opt/mcp-gateway")
GITHUB = "github/"
GITHUB_URL = "https://github.com/{owner}/{repo}"
GITHUB_KEYS = ("run_cmd", "install_cmd", "envs")
MAX_SERVERS = 32
MAX_CONFIG_BYTES = 64 << 10  # the SDK passes the config on a command line
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
GITHUB_RE = re.compile(r"github/([A-Za-z0-9_.-]{1,100})/([A-Za-z0-9_.-]{1,100})")
PLACEHOLDER_RE = re.compile(r"\$\{config\.([A-Za-z0-9_.-]+)\}")
CONFIG_ENV = "MCP_SERVER_CONFIG"


@dataclass
class ServerSpec:
    name: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    clone_url: str | None = None  # github/...: cloned into ``cwd`` first
    install_cmd: str | None = None


def _short(value: object, limit: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _strings(value: object, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and "\0" not in k + v for k, v in value.items()
    ):
        raise ValueError(f"{what} must be an object of strings")
    return value


def check(config: object) -> dict[str, dict[str, Any]]:
    """``config`` as the ``mcp`` option must be, else ValueError naming what is wrong (a plain
    ValueError: this module is also the sandbox's, outside the server's error tree)."""
    if not isinstance(config, dict):
        raise ValueError("mcp must be an object: MCP server name -> its configuration")
    if len(config) > MAX_SERVERS:
        raise ValueError(f"mcp names {len(config)} servers; at most {MAX_SERVERS}")
    if len(json.dumps(config)) > MAX_CONFIG_BYTES:
        raise ValueError(f"mcp is over {MAX_CONFIG_BYTES} bytes of JSON")
    for name, value in config.items():
        if not isinstance(value, dict):
            raise ValueError(f"mcp[{_short(name)}] must be an object, not {_short(value)}")
        if name.startswith(GITHUB):
            m = GITHUB_RE.fullmatch(name)
            if m is None or {m[1], m[2]} & {".", ".."}:
                raise ValueError(f"mcp key {_short(name)} must be github/<owner>/<repo>")
            unknown = sorted(set(value) - set(GITHUB_KEYS))
            if unknown:
                raise ValueError(
                    f"mcp[{_short(name)}]: unknown key {_short(unknown[0])} "
                    f"(known: {', '.join(GITHUB_KEYS)})"
                )
            run = value.get("run_cmd")
            if not isinstance(run, str) or not run.strip() or "\0" in run:
                raise ValueError(f"mcp[{_short(name)}].run_cmd must be a command (a string)")
            install = value.get("install_cmd")
            if install is not None and (not isinstance(install, str) or "\0" in install):
                raise ValueError(f"mcp[{_short(name)}].install_cmd must be a string")
            if "envs" in value:
                _strings(value["envs"], f"mcp[{_short(name)}].envs")
        elif not NAME_RE.fullmatch(name):
            raise ValueError(
                f"mcp server name {_short(name)} is not valid (letters, digits, "
                "'_', '.', '-'; or github/<owner>/<repo>)"
            )
    return config


def resolve(
    config: dict[str, dict[str, Any]], registry: Path = REGISTRY_DIR, work: Path = WORK_DIR
) -> tuple[list[ServerSpec], list[str]]:
    """The command of every server of a checked config, and one line per server that cannot
    run in this template."""
    specs: list[ServerSpec] = []
    errors: list[str] = []
    for name, value in config.items():
        if name.startswith(GITHUB):
            _, owner, repo = name.split("/")
            specs.append(
                ServerSpec(
                    name=name,
                    command=["/bin/bash", "-c", value["run_cmd"]],
                    env=dict(value.get("envs") or {}),
                    cwd=str(work / "github" / owner / repo),
                    clone_url=GITHUB_URL.format(owner=owner, repo=repo),
                    install_cmd=value.get("install_cmd") or None,
                )
            )
            continue
        path = registry / f"{name}.json"
        if not path.is_file():
            errors.append(f"MCP server '{name}' is not available in this template (no {path})")
            continue
        try:
            specs.append(registered(name, path, value))
        except (ValueError, OSError) as e:  # UnicodeDecodeError is a ValueError
            errors.append(f"MCP server '{name}': {e}")
    return specs, errors


def registered(name: str, path: Path, config: dict[str, Any]) -> ServerSpec:
    """The server of a registry file, its placeholders filled from ``config``."""
    try:
        entry = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path} is not JSON: {e}") from None
    if not isinstance(entry, dict):
        raise ValueError(f"{path} must be an object {{command, env, cwd}}")
    unknown = sorted(set(entry) - {"command", "env", "cwd"})
    if unknown:
        raise ValueError(f"{path}: unknown key {unknown[0]!r} (known: command, env, cwd)")
    command = entry.get("command")
    if (
        not isinstance(command, list)
        or not command
        or not all(isinstance(a, str) and "\0" not in a for a in command)
    ):
        raise ValueError(f"{path}: command must be a non-empty list of strings")
    env = _strings(entry.get("env", {}), f"{path}: env")
    cwd = entry.get("cwd")
    if cwd is not None and not (isinstance(cwd, str) and cwd.startswith("/")):
        raise ValueError(f"{path}: cwd must be an absolute path")

    def fill(text: str) -> str:
        def one(m: re.Match[str]) -> str:
            if m[1] not in config:
                raise ValueError(f"its config has no {m[1]!r} (the template's {path} uses it)")
            v = config[m[1]]
            return v if isinstance(v, str) else json.dumps(v)

        return PLACEHOLDER_RE.sub(one, text)

    return ServerSpec(
        name=name,
        command=[fill(a) for a in command],
        env={k: fill(v) for k, v in env.items()} | {CONFIG_ENV: json.dumps(config)},
        cwd=cwd,
    )
