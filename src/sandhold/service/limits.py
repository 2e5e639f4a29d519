"""The bounds of a create, checked before anything is made: the sizes of the environment and the
metadata, path lengths, how many mounts and file view roots. Whatever the surface (the E2B server,
the gateway's local provider), this is where each of them is enforced; the settings are
``sandhold.config.limits.CreateLimits`` (defaults and reasons there, table in docs/e2b.md). Each
refusal is an ``InvalidRequest`` that names the limit and its setting. Formats (an environment
variable's name, an absolute mount target, a normalized view root) are the spec's to check
(``sandhold.runtime.spec``)."""

from __future__ import annotations

from collections.abc import Mapping

from sandhold.config.limits import CreateLimits
from sandhold.errors import InvalidRequest
from sandhold.runtime.spec import clipped
from sandhold.service.records import CreateSandbox


def nbytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def over(settings: object, setting: str, what: str, size: int, unit: str = "bytes") -> None:
    """Refuse ``what`` if its ``size`` is over the limit of ``setting`` (a field of
    ``settings``); the message names both."""
    limit = getattr(settings, setting)
    if size > limit:
        raise InvalidRequest(
            f"{what} is {size} {unit}, over the limit of {limit} (setting {setting})"
        )


def check_env(env: Mapping[str, str], limits: CreateLimits, what: str = "the environment") -> None:
    """A create's environment, or a command's (the E2B data plane's ``process.envs``)."""
    over(limits, "sandbox_env_max_vars", what, len(env), "variables")
    total = 0
    for name, value in env.items():
        over(
            limits,
            "sandbox_env_max_name_bytes",
            f"environment variable name {clipped(name)}",
            nbytes(name),
        )
        over(
            limits,
            "sandbox_env_max_value_bytes",
            f"the value of environment variable {clipped(name)}",
            nbytes(value),
        )
        total += nbytes(name) + nbytes(value) + 2  # "NAME=value\0", as execve counts it
    over(limits, "sandbox_env_max_bytes", f"{what} (its NAME=value strings)", total)


def check_metadata(metadata: Mapping[str, str], limits: CreateLimits) -> None:
    over(limits, "sandbox_metadata_max_keys", "metadata", len(metadata), "keys")
    total = 0
    for key, value in metadata.items():
        if not key:
            raise InvalidRequest("metadata keys must not be empty")
        over(limits, "sandbox_metadata_max_key_bytes", f"metadata key {clipped(key)}", nbytes(key))
        over(
            limits,
            "sandbox_metadata_max_value_bytes",
            f"the value of metadata key {clipped(key)}",
            nbytes(value),
        )
        total += nbytes(key) + nbytes(value)
    over(limits, "sandbox_metadata_max_bytes", "metadata (its keys and values)", total)


def check_path(path: str, what: str, limits: CreateLimits) -> None:
    over(limits, "sandbox_max_path_bytes", f"{what} {clipped(path)}", nbytes(path))


def check_mounts(count: int, limits: CreateLimits) -> None:
    over(limits, "sandbox_max_mounts", "the list of mounts", count, "entries")


def check_view(view: Mapping[str, object], limits: CreateLimits) -> None:
    for kind in ("read", "write"):
        roots = view.get(kind)
        if not isinstance(roots, list):
            continue  # not a list at all: the spec says so
        over(
            limits,
            "sandbox_file_view_max_roots",
            f"the file view's {kind} list",
            len(roots),
            "roots",
        )
        for root in roots:
            if isinstance(root, str):
                check_path(root, f"file view {kind} root", limits)


def check_create(req: CreateSandbox, limits: CreateLimits) -> None:
    """Every bound of ``req``; raises ``InvalidRequest`` naming the first one it is over."""
    check_env(req.env, limits)
    check_metadata(req.metadata, limits)
    check_mounts(len(req.mounts), limits)
    for m in req.mounts:
        check_path(m.target, "mount target", limits)
        check_path(str(m.source), "mount source", limits)
    if req.workspace_dir is not None:
        check_path(str(req.workspace_dir), "workspace directory", limits)
    check_view(req.file_view, limits)
