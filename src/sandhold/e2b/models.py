"""Request bodies and query parameters of the E2B control plane, as the pinned SDK (e2b
2.63.0) sends them.

Every model forbids unknown keys and coerces nothing (``strict``): a wrong type or a key that
is not part of the API is a 400 that names it, never silently ignored. Every key the SDK can
send is declared, even the ones this server refuses, so that the refusal can say why.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request

from sandhold.errors import InvalidRequest


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class AutoResume(Body):
    enabled: bool = False


class VolumeMount(Body):
    name: str
    path: str


class Network(Body):
    allowPublicTraffic: bool | None = None
    allowOut: list[str] | None = None
    denyOut: list[str] | None = None
    dnsServers: list[str] | None = None
    egressProxy: dict[str, Any] | None = None
    maskRequestHost: str | None = None
    httpsPorts: list[int] | None = None
    rules: dict[str, Any] | None = None


class NetworkUpdate(Body):
    """``SandboxNetworkUpdateConfig`` (``PUT /sandboxes/{id}/network``): replaces the rules."""

    allowOut: list[str] | None = None
    denyOut: list[str] | None = None
    dnsServers: list[str] | None = None
    egressProxy: dict[str, Any] | None = None
    rules: dict[str, Any] | None = None
    allow_internet_access: bool | None = None


class NewSandbox(Body):
    """``NewSandboxV2`` (``POST /v2/sandboxes``)."""

    templateID: str
    timeout: int | None = None
    autoPause: bool = False
    autoPauseMemory: bool | None = None
    autoResume: AutoResume | None = None
    allow_internet_access: bool | None = None
    network: Network | None = None
    metadata: dict[str, str] | None = None
    envVars: dict[str, str] | None = None
    mcp: dict[str, Any] | None = None
    iam: dict[str, Any] | None = None
    volumeMounts: list[VolumeMount] | None = None


class NewSandboxV1(NewSandbox):
    """``NewSandbox`` (``POST /sandboxes``): the same plus ``secure``, which is always on here."""

    secure: bool | None = None


class ConnectV2(Body):
    timeout: int | None = None
    memory: bool | None = None


class ConnectV1(Body):
    timeout: int


class Resume(Body):
    timeout: int = 15  # the v1 API's documented default
    autoPause: bool | None = None
    memory: bool | None = None


class SetTimeout(Body):
    timeout: int


class Refresh(Body):
    duration: int | None = Field(None, ge=0, le=3600)


class Pause(Body):
    memory: bool | None = None
    requireHealthyGuest: bool | None = None


class NewVolume(Body):
    name: str


M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], raw: bytes, *, empty_ok: bool = False) -> M:
    """Validate a JSON body; every problem becomes a 400 naming the offending keys."""
    if not raw.strip() and empty_ok:
        raw = b"{}"
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        raise InvalidRequest(describe(e)) from None


def describe(e: ValidationError) -> str:
    problems = []
    for err in e.errors(include_url=False):
        if err["type"] == "json_invalid":
            return f"request body is not valid JSON: {err['msg'].removeprefix('Invalid JSON: ')}"
        loc = ".".join(str(x) for x in err["loc"])
        if err["type"] == "extra_forbidden":
            problems.append(f"unknown field {loc!r}")
        elif not loc:
            problems.append(f"request body: {err['msg']}")
        else:
            problems.append(f"field {loc!r}: {err['msg']}")
    return "invalid request: " + "; ".join(problems)


def int_param(request: Request, name: str) -> int | None:
    value = request.query_params.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise InvalidRequest(
            f"query parameter {name!r} must be an integer, got {value!r}"
        ) from None
