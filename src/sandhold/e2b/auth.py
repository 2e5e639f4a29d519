"""Who may do what: API keys map to teams on the control plane; on the data plane each sandbox's
own ``envdAccessToken`` (header or signed ``/files`` URL) and ``trafficAccessToken`` decide.

The in-sandbox agent checks nothing itself, so these checks are the only gate.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Mapping

from sandhold.errors import Forbidden, Unauthenticated

DEFAULT_TEAM = "default"


class Teams:
    def __init__(self, api_keys: Mapping[str, str]) -> None:
        self._keys = dict(api_keys)

    def team_of(self, headers: Mapping[str, str]) -> str:
        key = headers.get("x-api-key")
        if not self._keys:
            return DEFAULT_TEAM  # loopback-only mode (enforced at start): any key, one team
        if not key:
            raise Unauthenticated("missing X-API-KEY header")
        for known, team in self._keys.items():
            if hmac.compare_digest(known.encode(), key.encode()):
                return team
        raise Unauthenticated("invalid API key")


def file_signature(path: str, operation: str, user: str, token: str, expiration: int | None) -> str:
    """The SDK's v1 file-URL signature (``e2b/sandbox/signature.py``)."""
    raw = f"{path}:{operation}:{user}:{token}"
    if expiration is not None:
        raw += f":{expiration}"
    digest = hashlib.sha256(raw.encode()).digest()
    return "v1_" + base64.b64encode(digest).rstrip(b"=").decode()


def signature_error(token: str, method: str, query: Mapping[str, str]) -> str | None:
    """Why a ``/files`` signature does not authorize this request (None: it does), in envd's
    words and order: the signature first, then its expiration (a forger never learns whether
    the expiry was the problem)."""
    signature = query.get("signature")
    if not signature:
        return "missing signature query parameter"
    expiration: int | None = None
    if query.get("signature_expiration"):
        try:
            expiration = int(query["signature_expiration"])
        except ValueError:
            return "invalid signature"
    operation = "write" if method == "POST" else "read"
    expected = file_signature(
        query.get("path", ""), operation, query.get("username", ""), token, expiration
    )
    if not hmac.compare_digest(expected.encode(), signature.encode()):
        return "invalid signature"
    if expiration is not None and expiration < time.time():
        return EXPIRED
    return None


EXPIRED = "signature is already expired"


def check_envd_access(
    token: str, method: str, path: str, headers: Mapping[str, str], query: Mapping[str, str]
) -> None:
    """envd's rule: the access token on everything but ``GET /health``; ``/files`` also takes a
    valid signature instead."""
    if path == "/health" and method in ("GET", "HEAD"):
        return
    given = headers.get("x-access-token")
    if given is not None:
        if hmac.compare_digest(given.encode(), token.encode()):
            return
        raise Unauthenticated("invalid access token")
    if path == "/files" and "signature" in query:
        if (why := signature_error(token, method, query)) is None:
            return
        raise Unauthenticated(why)
    raise Unauthenticated("missing access token (X-Access-Token header)")


def check_traffic_access(
    traffic_token: str | None, envd_token: str, headers: Mapping[str, str]
) -> None:
    """Ports other than envd's: open, or gated by the traffic token (the envd token also works,
    so an SDK holding only that can still reach its sandbox's services)."""
    if traffic_token is None:
        return
    for header, expected in (
        ("e2b-traffic-access-token", traffic_token),
        ("x-access-token", envd_token),
    ):
        given = headers.get(header)
        if given is not None and hmac.compare_digest(given.encode(), expected.encode()):
            return
    raise Forbidden("this sandbox port requires the E2B-Traffic-Access-Token header")
