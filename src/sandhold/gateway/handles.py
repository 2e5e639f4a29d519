"""Provider handles at rest. The tokens a provider returns at create (envd's and the traffic
access token) control a live sandbox, so the session row keeps them sealed: AES-256-GCM under
the deployment's secrets key ring (``secrets_keys``, else the key file; see docs/egress.md),
bound to the tenant and session so that a sealed value copied onto another row does not open.
Every replica needs the same keys. The rest of a handle (domain, network) stays readable."""

from __future__ import annotations

import base64
import functools
import json
from typing import Any

from cryptography.exceptions import InvalidTag

from sandhold.config import Settings
from sandhold.egress.secrets import KeyRing, ring_of
from sandhold.errors import SecretKeyError
from sandhold.gateway.providers.base import ProviderError

SECRET_FIELDS = ("envd_token", "traffic_token")
SEALED = "sealed"


def _aad(tenant_id: str, session_id: str) -> bytes:
    return f"sandhold-handle\0{tenant_id}\0{session_id}".encode()


class HandleSealer:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @functools.cached_property
    def keyring(self) -> KeyRing:
        """Loaded (the key file created) on the first handle that has tokens to seal."""
        return ring_of(self.settings)

    def seal(self, handle: dict[str, Any], tenant_id: str, session_id: str) -> dict[str, Any]:
        secret = {k: handle[k] for k in SECRET_FIELDS if handle.get(k)}
        out = {k: v for k, v in handle.items() if k not in SECRET_FIELDS}
        if secret:
            aad = _aad(tenant_id, session_id)
            key_id, nonce, ct = self.keyring.seal(json.dumps(secret).encode(), aad)
            out[SEALED] = {"key": key_id, "nonce": _b64(nonce), "data": _b64(ct)}
        return out

    def unseal(self, handle: dict[str, Any], tenant_id: str, session_id: str) -> dict[str, Any]:
        sealed = handle.get(SEALED)
        out = {k: v for k, v in handle.items() if k != SEALED}
        if not sealed:
            return out
        keyring = self.keyring  # outside the try: a ring that fails to load is not a missing key
        try:
            plain = keyring.open(
                str(sealed.get("key", "")),
                base64.b64decode(sealed["nonce"]),
                base64.b64decode(sealed["data"]),
                _aad(tenant_id, session_id),
            )
        except SecretKeyError:
            raise ProviderError(
                f"session {session_id!r}: its provider tokens were sealed with a key this replica "
                "does not have; give every gateway replica the same secrets_keys"
            ) from None
        except (InvalidTag, KeyError, ValueError):
            raise ProviderError(
                f"session {session_id!r}: its sealed provider tokens do not open (tampered, or "
                "copied from another session)"
            ) from None
        return {**out, **json.loads(plain)}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
