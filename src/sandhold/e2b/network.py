"""E2B's egress options mapped to the runtime's ``NetworkPolicy``.

E2B's semantics: ``allow_internet_access=false`` means ``denyOut: ["0.0.0.0/0"]``; ``allowOut``
entries win over ``denyOut`` ones. Here a deny-everything entry (or ``false``) makes the sandbox
an allow-list of its ``allowOut``; ``true`` makes it open, minus ``denyOut``. Internal ranges
stay closed whatever the request says (see sandhold.egress.policy). Egress on this surface is
the operator's choice (``egress_e2b_enabled``); without it the options are refused as before.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from sandhold.config import Settings
from sandhold.e2b.secrets import values_of
from sandhold.egress import header_rules
from sandhold.egress.policy import ALL_TRAFFIC
from sandhold.errors import InvalidRequest
from sandhold.runtime.spec import NAME_RE, NetworkPolicy
from sandhold.service.metadata import SECRETS_SCOPE_KEY

# network keys that only make sense with egress
EGRESS_KEYS = ("allowOut", "dnsServers", "egressProxy", "httpsPorts", "rules")


def secrets_tenant(team: str, scope: str | None) -> str:
    """Whose secrets a team's sandbox gets: the team's, or with a scope (the create's
    ``sandhold.secrets-scope`` metadata, e.g. a gateway tenant) ``<team>:<scope>``, a namespace
    of the team's own: no team can name another team's secrets."""
    if scope is None:
        return team
    if not NAME_RE.match(scope):
        raise InvalidRequest(
            f"metadata {SECRETS_SCOPE_KEY!r} must be 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit",
        )
    return f"{team}:{scope}"


def egress_policy(
    settings: Settings, tenant: str, allow_internet_access: bool | None, network: dict[str, Any]
) -> NetworkPolicy:
    allow = list(network.get("allowOut") or [])
    deny = list(network.get("denyOut") or [])
    if not settings.egress_e2b_enabled:
        if allow_internet_access:
            raise InvalidRequest(
                "allow_internet_access=true is not enabled on this server: sandboxes have no "
                "network access unless the operator sets egress_e2b_enabled (omit it or pass "
                "false)",
            )
        refused = [k for k in EGRESS_KEYS if network.get(k)]
        if refused:
            raise InvalidRequest(
                f"network.{refused[0]} is not enabled on this server: sandboxes have no network "
                "access unless the operator sets egress_e2b_enabled",
            )
        return NetworkPolicy(mode="none")
    if network.get("egressProxy"):
        raise InvalidRequest(
            "network.egressProxy is not supported: egress always goes through "
            "this server's own proxy",
        )
    if network.get("httpsPorts"):
        raise InvalidRequest("network.httpsPorts is not supported by this server")
    deny_all = any(d.strip() in ALL_TRAFFIC for d in deny)
    deny = [d for d in deny if d.strip() not in ALL_TRAFFIC]
    if (allow_internet_access is True and not deny_all) or (
        allow_internet_access is None and not deny_all and settings.egress_e2b_default == "open"
    ):
        mode = "open"
    else:
        mode = "allowlist"
    if mode == "allowlist" and not allow and not settings.egress_e2b_updatable:
        mode = "none"
    rules = header_rules.from_e2b(network["rules"]) if network.get("rules") else []
    if rules and ":" in tenant:  # a scoped namespace (secrets_tenant): /secrets writes none
        raise InvalidRequest(
            f"network.rules cannot be combined with metadata {SECRETS_SCOPE_KEY!r}: rules name "
            "the team's own secrets (/secrets)"
        )
    missing = header_rules.secret_names(rules) - (
        values_of(settings).names(tenant) if rules else set()
    )
    if missing:
        raise InvalidRequest(
            f"network.rules: secret {sorted(missing)[0]!r} does not exist (create it with "
            "Secret.create first)"
        )
    try:
        return NetworkPolicy.model_validate(
            {"mode": mode, "allow": allow, "deny": deny, "tenant": tenant, "header_rules": rules}
        )
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        field = {"allow": "network.allowOut", "deny": "network.denyOut"}.get(
            str(err["loc"][0]) if err["loc"] else "", "network"
        )
        raise InvalidRequest(f"{field}: {err['msg'].removeprefix('Value error, ')}") from None
