"""A tenant's tunnels in the store, and their tokens.

A token authenticates by its sha256 (the ``tunnels.token_sha256`` unique index), like a tenant's
API key; a copy sealed under the secrets key ring (AES-256-GCM, bound to the tunnel's id) lets
an operator reveal it again. Neither the store nor a log line ever holds it in the clear.
"""

from __future__ import annotations

import base64
import builtins
import functools
import hashlib
import re
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidTag
from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError

from sandhold.config import Settings
from sandhold.egress.secrets import KeyRing, ring_of
from sandhold.errors import Conflict, InvalidRequest, NotFound, SecretKeyError
from sandhold.store.db import Store
from sandhold.store.models import Tenant, Tunnel, TunnelConnector, TunnelRequest

# A name is the prefix of the tunnel's tool names (``<name>__<tool>``): no "_", so that no
# tunnel tool can ever be named like a built-in one (none has "__") or like another tunnel's.
NAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?$")
TUNNEL_ID_RE = re.compile(r"^tunnel_[0-9a-f]{32}$")  # tunnel-client's format
TOKEN_PREFIX = "sht_"
MAX_DESCRIPTION = 1024
MAX_CONNECTORS = 32  # connector rows kept per tunnel (the most recently seen)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _aad(tunnel_id: str) -> bytes:
    return f"sandhold-tunnel-token\0{tunnel_id}".encode()


@dataclass(frozen=True)
class TunnelInfo:
    id: str
    tenant_id: str
    name: str
    description: str
    created_at: float
    updated_at: float
    connectors: list[dict[str, Any]] = field(default_factory=list)

    def public(self, stale_s: float | None = None) -> dict[str, Any]:
        out = {
            "id": self.id,
            "tenant_id": self.tenant_id,
            "name": self.name,
            "description": self.description,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }
        if stale_s is not None:
            now = time.time()
            out["connectors"] = [
                {**c, "live": now - c["last_seen_at"] <= stale_s} for c in self.connectors
            ]
        return out


def _info(t: Tunnel, connectors: list[TunnelConnector] | None = None) -> TunnelInfo:
    conns = [
        {
            "instance_id": c.instance_id,
            "client_name": c.client_name,
            "client_version": c.client_version,
            "channels": c.channels,
            "replica": c.replica,
            "first_seen_at": c.first_seen_at,
            "last_seen_at": c.last_seen_at,
        }
        for c in connectors or []
    ]
    return TunnelInfo(t.id, t.tenant_id, t.name, t.description, t.created_at, t.updated_at, conns)


def check_name(name: object) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise InvalidRequest(
            f"tunnel name {name!r} must be 1-32 lower-case letters, digits or '-' (not first or "
            "last): it prefixes the tunnel's tool names as <name>__<tool>"
        )
    return name


def check_tunnel_id(tunnel_id: str) -> str:
    if not TUNNEL_ID_RE.match(tunnel_id):
        raise NotFound(f"tunnel {tunnel_id[:80]!r} does not exist (ids are tunnel_<32 hex>)")
    return tunnel_id


class Registry:
    """Tunnels of every tenant: create, list, delete, reveal and rotate tokens, authenticate."""

    def __init__(self, settings: Settings, store: Store) -> None:
        self.settings = settings
        self.store = store

    @functools.cached_property
    def keyring(self) -> KeyRing:
        return ring_of(self.settings)

    def _sealed(self, tunnel_id: str, token: str) -> dict[str, str]:
        key_id, nonce, data = self.keyring.seal(token.encode(), _aad(tunnel_id))
        return {
            "key": key_id,
            "nonce": base64.b64encode(nonce).decode(),
            "data": base64.b64encode(data).decode(),
        }

    # -- writing -----------------------------------------------------------------------------
    def create(self, tenant_id: str, name: str, description: str = "") -> tuple[TunnelInfo, str]:
        """A new tunnel and its token (returned once here; ``reveal`` opens the sealed copy)."""
        check_name(name)
        if not isinstance(description, str) or len(description) > MAX_DESCRIPTION:
            raise InvalidRequest(
                f"description must be a string of at most {MAX_DESCRIPTION} characters"
            )
        tunnel_id = f"tunnel_{uuid.uuid4().hex}"
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        sealed = self._sealed(tunnel_id, token)
        now = time.time()
        with self.store.db.begin() as db:
            if db.get(Tenant, tenant_id) is None:
                raise NotFound(f"tenant {tenant_id!r} does not exist")
            row = Tunnel(
                id=tunnel_id,
                tenant_id=tenant_id,
                name=name,
                description=description,
                token_sha256=token_digest(token),
                token_sealed=sealed,
                created_at=now,
                updated_at=now,
            )
            db.add(row)
            try:
                db.flush()
            except IntegrityError:
                raise Conflict(
                    f"tenant {tenant_id!r} already has a tunnel named {name!r}"
                ) from None
            info = _info(row)
        return info, token

    def delete(self, tunnel_id: str) -> None:
        check_tunnel_id(tunnel_id)
        with self.store.db.begin() as db:
            # the cascade is explicit: SQLite enforces foreign keys, but not every store does
            db.execute(delete(TunnelConnector).where(TunnelConnector.tunnel_id == tunnel_id))
            db.execute(delete(TunnelRequest).where(TunnelRequest.tunnel_id == tunnel_id))
            n = db.execute(delete(Tunnel).where(Tunnel.id == tunnel_id)).rowcount  # type: ignore[attr-defined]
        if not n:
            raise NotFound(f"tunnel {tunnel_id!r} does not exist")

    def rotate(self, tunnel_id: str) -> str:
        """A new token; the old one stops working at once (connectors using it get 401)."""
        check_tunnel_id(tunnel_id)
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self.store.db.begin() as db:
            n = db.execute(
                update(Tunnel)
                .where(Tunnel.id == tunnel_id)
                .values(
                    token_sha256=token_digest(token),
                    token_sealed=self._sealed(tunnel_id, token),
                    updated_at=time.time(),
                )
            ).rowcount  # type: ignore[attr-defined]
        if not n:
            raise NotFound(f"tunnel {tunnel_id!r} does not exist")
        return token

    def reveal(self, tunnel_id: str) -> str:
        row = self._row(tunnel_id)
        sealed = row.token_sealed or {}
        try:
            plain = self.keyring.open(
                str(sealed.get("key", "")),
                base64.b64decode(sealed["nonce"]),
                base64.b64decode(sealed["data"]),
                _aad(tunnel_id),
            )
        except SecretKeyError:
            raise SecretKeyError(
                f"tunnel {tunnel_id!r}: its token was sealed with a key this replica does not "
                "have (give every replica the same secrets_keys), or rotate the token"
            ) from None
        except (InvalidTag, KeyError, ValueError):
            raise SecretKeyError(
                f"tunnel {tunnel_id!r}: its sealed token does not open "
                "(tampered, or copied from another tunnel)"
            ) from None
        return plain.decode()

    # -- reading -----------------------------------------------------------------------------
    def _row(self, tunnel_id: str) -> Tunnel:
        check_tunnel_id(tunnel_id)
        with self.store.db() as db:
            row = db.get(Tunnel, tunnel_id)
        if row is None:
            raise NotFound(f"tunnel {tunnel_id!r} does not exist")
        return row

    def get(self, tunnel_id: str) -> TunnelInfo:
        row = self._row(tunnel_id)
        with self.store.db() as db:
            conns = list(
                db.scalars(
                    select(TunnelConnector)
                    .where(TunnelConnector.tunnel_id == tunnel_id)
                    .order_by(TunnelConnector.first_seen_at)
                )
            )
        return _info(row, conns)

    def list(self, tenant_id: str | None = None) -> builtins.list[TunnelInfo]:
        q = select(Tunnel).order_by(Tunnel.tenant_id, Tunnel.name)
        if tenant_id is not None:
            q = q.where(Tunnel.tenant_id == tenant_id)
        with self.store.db() as db:
            rows = list(db.scalars(q))
            conns = list(
                db.scalars(
                    select(TunnelConnector).where(
                        TunnelConnector.tunnel_id.in_([r.id for r in rows])
                    )
                )
            )
        by_tunnel: dict[str, builtins.list[TunnelConnector]] = {}
        for c in conns:
            by_tunnel.setdefault(c.tunnel_id, []).append(c)
        return [_info(r, by_tunnel.get(r.id)) for r in rows]

    def by_name(self, tenant_id: str, name: str) -> TunnelInfo | None:
        with self.store.db() as db:
            row = db.scalars(
                select(Tunnel).where(Tunnel.tenant_id == tenant_id, Tunnel.name == name)
            ).first()
        return None if row is None else _info(row)

    def by_token(self, token: str) -> TunnelInfo | None:
        """The tunnel whose token this is (a tenant's API key is no tunnel's token)."""
        if not token.startswith(TOKEN_PREFIX):
            return None
        with self.store.db() as db:
            row = db.scalars(
                select(Tunnel).where(Tunnel.token_sha256 == token_digest(token))
            ).first()
        return None if row is None else _info(row)

    def live_channels(self, tunnel_id: str, stale_s: float) -> builtins.list[str]:
        """The channels that the connectors seen within ``stale_s`` serve ([] if none is)."""
        since = time.time() - stale_s
        with self.store.db() as db:
            rows = db.scalars(
                select(TunnelConnector.channels).where(
                    TunnelConnector.tunnel_id == tunnel_id, TunnelConnector.last_seen_at >= since
                )
            )
            seen = [list(r or ["main"]) for r in rows]
        return sorted({c for chans in seen for c in chans})

    def connector_seen_at(self, tunnel_id: str, instance_id: str) -> float | None:
        with self.store.db() as db:
            return db.scalar(
                select(TunnelConnector.last_seen_at).where(
                    TunnelConnector.tunnel_id == tunnel_id,
                    TunnelConnector.instance_id == instance_id,
                )
            )

    def seen(
        self,
        tunnel_id: str,
        instance_id: str,
        name: str | None,
        version: str | None,
        channels: builtins.list[str] | None,
        replica: str,
    ) -> None:
        """Record that a connector polls now (an upsert that starts with its write)."""
        now = time.time()
        values = {
            "client_name": name,
            "client_version": version,
            "channels": channels,
            "replica": replica,
            "last_seen_at": now,
        }
        for _attempt in range(2):
            try:
                with self.store.db.begin() as db:
                    n = db.execute(
                        update(TunnelConnector)
                        .where(
                            TunnelConnector.tunnel_id == tunnel_id,
                            TunnelConnector.instance_id == instance_id,
                        )
                        .values(**values)
                    ).rowcount  # type: ignore[attr-defined]
                    if not n:
                        db.add(
                            TunnelConnector(
                                tunnel_id=tunnel_id,
                                instance_id=instance_id,
                                first_seen_at=now,
                                **values,
                            )
                        )
                        # connectors gone for a day are forgotten, and a token holder
                        # inventing instance ids keeps only the most recent few rows
                        db.execute(
                            delete(TunnelConnector).where(
                                TunnelConnector.tunnel_id == tunnel_id,
                                TunnelConnector.last_seen_at < now - 86400,
                            )
                        )
                        oldest = db.scalars(
                            select(TunnelConnector.instance_id)
                            .where(TunnelConnector.tunnel_id == tunnel_id)
                            .order_by(TunnelConnector.last_seen_at.desc())
                            .offset(MAX_CONNECTORS)
                        ).all()
                        if oldest:
                            db.execute(
                                delete(TunnelConnector).where(
                                    TunnelConnector.tunnel_id == tunnel_id,
                                    TunnelConnector.instance_id.in_(oldest),
                                )
                            )
                return
            except IntegrityError:  # two replicas inserted the same connector at once
                continue
