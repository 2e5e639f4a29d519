"""A sandbox's header rules, E2B's ``network.rules``: headers the egress proxy sets on the
requests bound for a host, their values able to name the tenant's secrets as
``${e2b.secrets.NAME}``, resolved per request (an updated secret applies at once) and never
shown to the sandbox.

A rule does not open egress: the host must be allowed too. Secret-bearing headers are added
over TLS only (over plain HTTP anyone on the path would read them); headers without a secret
go on both. Where a native secret (``sandhold secret set``) and a rule set the same header,
the rule wins: it is the more specific, per-sandbox choice.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandhold.egress.policy import parse_rule
from sandhold.errors import InvalidRequest

SECRET_REF = re.compile(r"\$\{e2b\.secrets\.([^{}]*)\}")
IDENTITY_REF = "${e2b.identity."
MAX_HOSTS, MAX_HEADERS, MAX_VALUE = 100, 32, 8192
HEADER_RE = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$")
# Headers the proxy owns or that would change how the request is framed.
FORBIDDEN_HEADERS = {
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "proxy-authorization",
    "keep-alive",
}


class HeaderRule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = Field(description="domain or *.domain")
    headers: dict[str, str] = Field(default_factory=dict)


def from_e2b(raw: object) -> list[HeaderRule]:
    """``{host: [{"transform": {"headers": {...}}}, ...]}`` as the SDK sends it, checked; the
    rules of one host are kept in order (a later one overrides an earlier one's header)."""
    if not isinstance(raw, dict):
        raise InvalidRequest("network.rules must be an object of host → list of rules")
    if len(raw) > MAX_HOSTS:
        raise InvalidRequest(f"network.rules names more than {MAX_HOSTS} hosts")
    out = []
    for host, rules in raw.items():
        _check_host(host)
        if not isinstance(rules, list):
            raise InvalidRequest(f"network.rules[{host!r}] must be a list of rules")
        for rule in rules:
            out.append(HeaderRule(host=host.strip().lower(), headers=_headers_of(host, rule)))
    return out


def _check_host(host: object) -> None:
    try:
        rule = parse_rule(host)  # type: ignore[arg-type]
    except ValueError as e:
        raise InvalidRequest(f"network.rules: {e}") from None
    if rule.network is not None:
        raise InvalidRequest(
            f"network.rules: {host!r} is an address; rules apply to domains and *.domains only "
            "(the proxy matches a request by the name it was sent to)"
        )


def _headers_of(host: str, rule: Any) -> dict[str, str]:
    if not isinstance(rule, dict) or set(rule) - {"transform"}:
        raise InvalidRequest(f"network.rules[{host!r}]: a rule is an object with a 'transform'")
    transform = rule.get("transform") or {}
    if not isinstance(transform, dict) or set(transform) - {"headers"}:
        raise InvalidRequest(f"network.rules[{host!r}]: a transform has only 'headers'")
    headers = transform.get("headers") or {}
    if not isinstance(headers, dict) or len(headers) > MAX_HEADERS:
        raise InvalidRequest(
            f"network.rules[{host!r}]: headers must be an object of at most {MAX_HEADERS} entries"
        )
    for name, value in headers.items():
        if not HEADER_RE.match(name) or name.lower() in FORBIDDEN_HEADERS:
            raise InvalidRequest(
                f"network.rules[{host!r}]: {name!r} is not a header a rule may set"
            )
        if (
            not isinstance(value, str)
            or len(value) > MAX_VALUE
            or any(c in value for c in "\r\n\0")
        ):
            raise InvalidRequest(
                f"network.rules[{host!r}]: the value of {name!r} must be a string of at most "
                f"{MAX_VALUE} characters without CR, LF or NUL"
            )
        if IDENTITY_REF in value:
            raise InvalidRequest(
                "network.rules: workload identity tokens (${e2b.identity...}) are not supported "
                "by this server"
            )
    return dict(headers)


def secret_names(rules: list[HeaderRule]) -> set[str]:
    """Every secret the rules name (lower-cased, as secrets are stored)."""
    return {m.lower() for r in rules for v in r.headers.values() for m in SECRET_REF.findall(v)}
