"""The ``e2b`` provider: any E2B-compatible endpoint over plain HTTP (httpx).

Plain HTTP rather than the ``e2b`` SDK because the SDK gets in the way exactly where the
endpoints differ: CubeSandbox has no ``POST /v2/sandboxes`` (the SDK >= 2.51 gets 405), reports
states the SDK's enum lacks (``pausing``), answers 503 + ``Retry-After`` while a sandbox is
locked, and mounts host directories through its ``host-mount`` metadata key. The flavor
(``sandhold``, ``e2b``, ``cube``) selects those differences and the capabilities.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

import httpx

from sandhold.config import Settings
from sandhold.egress.policy import ALL_TRAFFIC, EgressPolicy
from sandhold.envd.transports import remote_channel
from sandhold.errors import SandholdError, Unsupported
from sandhold.gateway.providers.base import (
    Capabilities,
    Channel,
    CreateRequest,
    NeedsNewSandbox,
    PreconditionFailed,
    Provider,
    ProviderError,
    ProviderSandbox,
    SandboxGone,
)
from sandhold.isotime import iso
from sandhold.service.metadata import (
    FILE_VIEW_KEY,
    HOST_MOUNT_KEY,
    SECRETS_SCOPE_KEY,
    WORKSPACE_DISK_KEY,
)

log = logging.getLogger(__name__)

PAGE = 100
BUSY_RETRIES = 5  # CubeSandbox answers 503 + Retry-After while a sandbox is pausing or locked

# suspends_to_disk: E2B cloud persists a paused sandbox's memory snapshot (it holds no host
# memory while paused); a Sandhold server says whether it does (start(): its /metrics gauge),
# false until then or when it cannot be asked; CubeSandbox keeps paused sandboxes in memory.
# snapshots and fork: E2B cloud has both; a Sandhold server answers 501 for them (not built).
CAPABILITIES = {
    "sandhold": Capabilities(
        pause_keeps_memory=True,
        suspends_to_disk=False,
        snapshots=False,
        fork=False,
        auto_resume=True,
        mount_workspace=True,
        conditional_delete=True,
        idle_timeout=False,
        per_sandbox_limits=False,
    ),
    "e2b": Capabilities(
        pause_keeps_memory=True,
        suspends_to_disk=True,
        snapshots=True,
        fork=True,
        auto_resume=True,
        mount_workspace=False,
        conditional_delete=False,
        idle_timeout=False,
        per_sandbox_limits=False,
    ),
    "cube": Capabilities(
        pause_keeps_memory=True,
        suspends_to_disk=False,
        snapshots=False,
        fork=False,
        auto_resume=True,
        mount_workspace=True,
        conditional_delete=False,
        idle_timeout=True,
        per_sandbox_limits=False,
    ),
}
SUSPEND_GAUGE = re.compile(r"^sandhold_suspend_to_disk (\d+)$", re.M)


def _ts(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _sandbox(d: dict[str, Any]) -> ProviderSandbox:
    state = d.get("state", "running")
    if state not in ("running", "paused", "pausing"):
        state = "paused" if state == "resuming" else "running"
    return ProviderSandbox(
        id=d["sandboxID"],
        state=state,
        end_at=_ts(d.get("endAt")),
        started_at=_ts(d.get("startedAt")) or 0.0,
        metadata=dict(d.get("metadata") or {}),
        failure=d.get("sandholdFailure"),  # a Sandhold server's; E2B's own never send it
        suspended=d.get("sandholdSuspended") == "disk",  # a Sandhold server's, too
    )


def _egress(network: EgressPolicy) -> dict[str, Any]:
    """The E2B wire form of an egress policy: ``allow_internet_access`` opens everything,
    ``denyOut`` of all traffic makes ``allowOut`` an allow-list (allow wins over deny)."""
    rules: dict[str, Any] = {}
    if network.allow:
        rules["allowOut"] = network.allow
    deny = [*network.deny] if network.mode == "open" else [ALL_TRAFFIC[0], *network.deny]
    if deny:
        rules["denyOut"] = deny
    return {"allow_internet_access": network.mode == "open", "network": rules}


def _message(r: httpx.Response) -> str:
    try:
        return str(r.json().get("message", r.text))
    except ValueError:
        return r.text[:500]


# What an E2B API's answer means here, for the operations that give a status a meaning (the
# inbound twin of e2b/errors.py's E2B_STATUS); any other unexpected status is a ProviderError.
INBOUND: dict[str, dict[int, type[SandholdError]]] = {
    "connect": {404: SandboxGone},
    "update_network": {404: SandboxGone, 409: NeedsNewSandbox},
    "kill": {412: PreconditionFailed},
}


def raise_for(r: httpx.Response, op: str, *expected: int) -> None:
    """Nothing if ``r`` has a status ``op`` expects; else the leaf of the error tree its status
    means for ``op`` (INBOUND), or a ProviderError naming the status and the server's words."""
    if r.status_code in expected:
        return
    leaf = INBOUND.get(op, {}).get(r.status_code)
    if leaf is not None:
        raise leaf(_message(r))
    raise ProviderError(f"{op} failed ({r.status_code}): {_message(r)}")


class E2bProvider(Provider):
    name = "e2b"

    def __init__(self, settings: Settings) -> None:
        api_url = settings.gateway_e2b_api_url
        assert api_url, "GatewaySettings refuses gateway_provider=e2b without it"
        self.flavor = settings.gateway_e2b_flavor
        self.capabilities = CAPABILITIES[self.flavor]
        self.sandbox_url = settings.gateway_e2b_sandbox_url
        self.domain = settings.gateway_e2b_domain
        headers = {"X-API-KEY": settings.gateway_e2b_api_key or ""}
        timeout = httpx.Timeout(settings.gateway_provider_timeout_s)
        self.api = httpx.AsyncClient(base_url=api_url, headers=headers, timeout=timeout)
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
        self.data = httpx.AsyncClient(timeout=None, limits=limits)

    async def start(self) -> None:
        if self.flavor == "sandhold":
            suspends = await self._server_suspends_to_disk()
            self.capabilities = replace(self.capabilities, suspends_to_disk=suspends)

    async def _server_suspends_to_disk(self) -> bool:
        """What the Sandhold server says (``sandhold_suspend_to_disk`` on its ``/metrics``); a
        server that cannot be asked, or too old to say, counts as not suspending."""
        try:
            r = await self._call("GET", "/metrics")
        except ProviderError as e:
            log.warning("cannot ask the Sandhold server whether it suspends to disk: %s", e)
            return False
        m = SUSPEND_GAUGE.search(r.text) if r.status_code == 200 else None
        if m is None:
            log.warning(
                "the Sandhold server does not say whether it suspends to disk "
                "(GET /metrics: %s); assuming it does not",
                r.status_code,
            )
            return False
        return m[1] == "1"

    async def close(self) -> None:
        await self.api.aclose()
        await self.data.aclose()

    async def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        for attempt in range(BUSY_RETRIES + 1):
            try:
                r = await self.api.request(method, path, **kw)
            except httpx.HTTPError as e:
                raise ProviderError(f"{method} {path}: {type(e).__name__}: {e}") from None
            if r.status_code != 503 or attempt == BUSY_RETRIES:
                return r
            await asyncio.sleep(min(float(r.headers.get("retry-after") or 1), 5.0))
        raise AssertionError("unreachable")

    async def create(self, req: CreateRequest) -> tuple[ProviderSandbox, dict[str, Any]]:
        metadata = dict(req.metadata)
        binds = [
            {"hostPath": str(src), "mountPath": dst, "readOnly": True} for src, dst in req.views
        ]
        if binds and not self.capabilities.mount_workspace:
            raise ProviderError(
                f"the {self.flavor} flavor cannot mount host directories, so the tenant's "
                "skills and references cannot be shown"
            )
        if req.workspace_dir is not None:
            binds.insert(
                0,
                {"hostPath": str(req.workspace_dir), "mountPath": "/workspace", "readOnly": False},
            )
        if binds:
            metadata[HOST_MOUNT_KEY] = json.dumps(binds)
        if req.workspace_disk_mb is not None:
            # Only a Sandhold server knows the key; the others would ignore it: never unenforced.
            if self.flavor != "sandhold" or req.workspace_dir is None:
                raise Unsupported(
                    f"the {self.flavor} flavor cannot cap a workspace's disk: unset the tenant "
                    "policy's workspace_disk_mb (it needs the local provider or a Sandhold server)"
                )
            metadata[WORKSPACE_DISK_KEY] = str(req.workspace_disk_mb)
        if self.flavor == "sandhold":
            # The server enforces the session's file view, and injects the secrets of
            # "<the API key's team>:<gateway tenant>".
            if req.file_view is not None:
                metadata[FILE_VIEW_KEY] = json.dumps(req.file_view)
            metadata[SECRETS_SCOPE_KEY] = req.tenant
        body: dict[str, Any] = {
            "templateID": req.template,
            "timeout": req.timeout_s,
            "autoPause": True,
            "autoResume": {"enabled": True},
            "metadata": metadata,
            "envVars": req.env,
        }
        body.update(_egress(req.network))
        path = "/v2/sandboxes"
        if self.flavor == "cube":
            # CubeAPI has no v2 create and, before v0.7, dropped the flattened fields: send both.
            body["lifecycle"] = {"onTimeout": "pause", "autoResume": True}
            path = "/sandboxes"
        r = await self._call("POST", path, json=body)
        raise_for(r, "create", 201)
        d = r.json()
        handle = {
            "envd_token": d.get("envdAccessToken"),
            "traffic_token": d.get("trafficAccessToken"),
            "domain": d.get("domain"),
        }
        info = await self.get(d["sandboxID"])
        if info is None:
            raise ProviderError(f"sandbox {d['sandboxID']} vanished right after create")
        return info, handle

    async def connect(self, sandbox_id: str, timeout_s: int) -> tuple[bool, dict[str, Any]]:
        path = f"/sandboxes/{sandbox_id}/connect"
        if self.flavor != "cube":
            path = "/v2" + path
        r = await self._call("POST", path, json={"timeout": timeout_s})
        raise_for(r, "connect", 200, 201)
        d = r.json()
        fresh = {
            k: v
            for k, v in (("envd_token", d.get("envdAccessToken")), ("domain", d.get("domain")))
            if v
        }
        return r.status_code == 201, fresh

    async def set_timeout(self, sandbox_id: str, timeout_s: int) -> None:
        r = await self._call(
            "POST", f"/sandboxes/{sandbox_id}/timeout", json={"timeout": timeout_s}
        )
        raise_for(r, "set_timeout", 204, 404)  # gone: nothing to extend

    async def update_network(self, sandbox_id: str, tenant: str, network: EgressPolicy) -> None:
        wire = _egress(network)
        body = {**wire["network"], "allow_internet_access": wire["allow_internet_access"]}
        r = await self._call("PUT", f"/sandboxes/{sandbox_id}/network", json=body)
        raise_for(r, "update_network", 204)

    async def get(self, sandbox_id: str) -> ProviderSandbox | None:
        r = await self._call("GET", f"/sandboxes/{sandbox_id}")
        if r.status_code == 404:
            return None
        raise_for(r, "get", 200)
        return _sandbox(r.json())

    async def list(self, metadata: dict[str, str]) -> list[ProviderSandbox]:
        # The SDK's encoding, which every E2B-compatible server decodes (see e2b-wire-protocol).
        query = urlencode({quote(k): quote(v) for k, v in metadata.items()})
        out: list[ProviderSandbox] = []
        token: str | None = None
        while True:
            params = {"metadata": query, "limit": str(PAGE)}
            if token:
                params["nextToken"] = token
            r = await self._call("GET", "/v2/sandboxes", params=params)
            raise_for(r, "list", 200)
            # Filter again: servers that ignore a filter must not make us act on strangers.
            out += [
                s
                for s in map(_sandbox, r.json())
                if all(s.metadata.get(k) == v for k, v in metadata.items())
            ]
            token = r.headers.get("x-next-token")
            if not token:
                return out

    async def kill(self, sandbox_id: str, if_paused_end_at: float | None = None) -> bool:
        headers = {}
        if if_paused_end_at is not None:
            if not self.capabilities.conditional_delete:
                raise ProviderError(f"the {self.flavor} flavor cannot delete conditionally")
            headers = {
                "X-Sandhold-If-State": "paused",
                "X-Sandhold-If-End-At": iso(if_paused_end_at),
            }
        r = await self._call("DELETE", f"/sandboxes/{sandbox_id}", headers=headers)
        if r.status_code == 404:
            return False
        raise_for(r, "kill", 204)
        return True

    @contextlib.asynccontextmanager
    async def channel(
        self, sandbox_id: str, handle: dict[str, Any], port: int
    ) -> AsyncIterator[Channel]:
        tokens = {
            "envd": handle.get("envd_token") or "",
            "traffic": handle.get("traffic_token") or "",
        }
        domain = handle.get("domain") or self.domain
        yield remote_channel(self.data, self.sandbox_url, domain, sandbox_id, port, tokens)
