"""E2B's secrets (``/secrets``): named values a team stores once and its sandboxes' header rules
name as ``${e2b.secrets.NAME}``, resolved by the egress proxy per request, never returned by
any API and never visible inside a sandbox.

They live next to the native secrets (``sandhold.egress.secrets``), in the same SQLite file,
sealed with the same key ring, but they name no host: where a value goes is the sandbox's
``network.rules``. An update stores the next version; only the current one is kept (no
placeholder can name an older one), so a replaced value is gone from the disk too.
"""

from __future__ import annotations

import builtins
import json
import re
import secrets
import sqlite3
import string
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from sandhold.errors import Conflict, InvalidRequest, NotFound

NAME_RE = re.compile(r"^[a-z0-9_-]{1,128}$")
ID_PREFIX = "sec_"  # reserved: names never start with it, so a reference is one or the other
ID_ALPHABET = string.ascii_lowercase + string.digits
MAX_VALUE = 16 * 1024
MAX_METADATA_ENTRIES, MAX_METADATA_KEY, MAX_METADATA_VALUE, MAX_METADATA = 32, 128, 1024, 8192
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS e2b_secrets (tenant TEXT NOT NULL, id TEXT NOT NULL, "
    "name TEXT NOT NULL, version INTEGER NOT NULL, metadata TEXT NOT NULL, key_id TEXT NOT NULL, "
    "nonce BLOB NOT NULL, ciphertext BLOB NOT NULL, created_at REAL NOT NULL, "
    "updated_at REAL NOT NULL, PRIMARY KEY (tenant, id), UNIQUE (tenant, name))"
)


Connect = Callable[[], AbstractContextManager[sqlite3.Connection]]  # one transaction, then closed


class Sealer(Protocol):
    """What the values need of the store's key ring (``sandhold.egress.secrets.KeyRing``)."""

    def seal(self, plaintext: bytes, aad: bytes) -> tuple[str, bytes, bytes]: ...

    def unseal(self, what: str, key_id: str, nonce: bytes, sealed: bytes, aad: bytes) -> bytes: ...


@dataclass
class ValueInfo:
    tenant: str
    id: str
    name: str
    version: int
    metadata: dict[str, str]
    created_at: float
    updated_at: float


def _aad(tenant: str, secret_id: str, version: int) -> bytes:
    return f"sandhold-e2b-secret\0{tenant}\0{secret_id}\0{version}".encode()


def canonical_name(name: str) -> str:
    """Names are lower-cased, as E2B stores them; ``sec_`` is reserved for identifiers."""
    low = name.lower() if isinstance(name, str) else ""
    if not NAME_RE.match(low) or low.startswith(ID_PREFIX):
        raise InvalidRequest(
            f"secret name {name!r} must be 1-128 letters, digits, '_' or '-' and must not start "
            f"with {ID_PREFIX!r}"
        )
    return low


def _check_value(value: object) -> bytes:
    if not isinstance(value, str) or not value or len(value) > MAX_VALUE:
        raise InvalidRequest(f"a secret value must be a string of 1-{MAX_VALUE} characters")
    if any(c in value for c in "\r\n\0"):  # it goes into a header
        raise InvalidRequest("a secret value must not contain CR, LF or NUL")
    return value.encode()


def check_metadata(metadata: object) -> dict[str, str]:
    if metadata is None:
        return {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise InvalidRequest("secret metadata must be an object of strings")
    if len(metadata) > MAX_METADATA_ENTRIES:
        raise InvalidRequest(f"secret metadata has more than {MAX_METADATA_ENTRIES} entries")
    for k, v in metadata.items():
        if not k or len(k.encode()) > MAX_METADATA_KEY or len(v.encode()) > MAX_METADATA_VALUE:
            raise InvalidRequest(
                f"secret metadata keys are 1-{MAX_METADATA_KEY} bytes and values at most "
                f"{MAX_METADATA_VALUE} bytes ({k[:40]!r})"
            )
    if sum(len(k.encode()) + len(v.encode()) for k, v in metadata.items()) > MAX_METADATA:
        raise InvalidRequest(f"secret metadata is larger than {MAX_METADATA} bytes")
    return dict(metadata)


class SecretValues:
    """The ``e2b_secrets`` table of a ``SecretStore``'s file, per tenant (an E2B team):
    ``connect`` opens that file, ``keyring`` is the store's."""

    def __init__(self, connect: Connect, keyring: Sealer) -> None:
        self.connect = connect
        self.keyring = keyring
        with connect() as db:
            db.execute(SCHEMA)

    def _where(self, ref: str) -> tuple[str, str]:
        if ref.startswith(ID_PREFIX):
            return "id", ref
        return "name", ref.lower()

    def _row(self, db: sqlite3.Connection, tenant: str, ref: str) -> tuple[object, ...]:
        column, key = self._where(ref)
        row = db.execute(
            "SELECT id, name, version, metadata, created_at, updated_at FROM e2b_secrets "
            f"WHERE tenant=? AND {column}=?",
            (tenant, key),
        ).fetchone()
        if row is None:
            raise NotFound(f"secret {ref!r} not found")
        return tuple(row)

    @staticmethod
    def _info(tenant: str, row: tuple[object, ...]) -> ValueInfo:
        sid, name, version, metadata, created, updated = row
        return ValueInfo(
            tenant,
            str(sid),
            str(name),
            int(str(version)),
            json.loads(str(metadata)),
            float(str(created)),
            float(str(updated)),
        )

    # -- writing ------------------------------------------------------------------------------
    def create(
        self, tenant: str, name: str, value: str, metadata: dict[str, str] | None = None
    ) -> ValueInfo:
        name, raw, meta = canonical_name(name), _check_value(value), check_metadata(metadata)
        sid = ID_PREFIX + "".join(secrets.choice(ID_ALPHABET) for _ in range(20))
        key_id, nonce, sealed = self.keyring.seal(raw, _aad(tenant, sid, 1))
        now = time.time()
        try:
            with self.connect() as db:
                db.execute(
                    "INSERT INTO e2b_secrets VALUES (?,?,?,?,?,?,?,?,?,?)",
                    (tenant, sid, name, 1, json.dumps(meta), key_id, nonce, sealed, now, now),
                )
        except sqlite3.IntegrityError:
            raise Conflict(f"secret with name {name!r} already exists") from None
        return ValueInfo(tenant, sid, name, 1, meta, now, now)

    def update(
        self, tenant: str, ref: str, value: str, metadata: dict[str, str] | None = None
    ) -> ValueInfo:
        """The next version replaces the value; metadata is replaced only when given."""
        raw = _check_value(value)
        meta = None if metadata is None else check_metadata(metadata)
        with self.connect() as db:
            info = self._info(tenant, self._row(db, tenant, ref))
            version, now = info.version + 1, time.time()
            key_id, nonce, sealed = self.keyring.seal(raw, _aad(tenant, info.id, version))
            info.metadata = info.metadata if meta is None else meta
            db.execute(
                "UPDATE e2b_secrets SET version=?, metadata=?, key_id=?, nonce=?, ciphertext=?, "
                "updated_at=? WHERE tenant=? AND id=?",
                (version, json.dumps(info.metadata), key_id, nonce, sealed, now, tenant, info.id),
            )
        info.version, info.updated_at = version, now
        return info

    def delete(self, tenant: str, ref: str) -> None:
        column, key = self._where(ref)
        with self.connect() as db:
            n = db.execute(
                f"DELETE FROM e2b_secrets WHERE tenant=? AND {column}=?", (tenant, key)
            ).rowcount
        if not n:
            raise NotFound(f"secret {ref!r} not found")

    def rotate(self, db: sqlite3.Connection) -> int:
        """Re-seal every value with the newest key (inside the store's rotation)."""
        rows = db.execute(
            "SELECT tenant, id, version, key_id, nonce, ciphertext FROM e2b_secrets"
        ).fetchall()
        for tenant, sid, version, key_id, nonce, sealed in rows:
            aad = _aad(tenant, sid, version)
            value = self.keyring.unseal(
                f"secret {sid!r} of tenant {tenant!r}", key_id, nonce, sealed, aad
            )
            new_id, new_nonce, resealed = self.keyring.seal(value, aad)
            db.execute(
                "UPDATE e2b_secrets SET key_id=?, nonce=?, ciphertext=? WHERE tenant=? AND id=?",
                (new_id, new_nonce, resealed, tenant, sid),
            )
        return len(rows)

    # -- reading ------------------------------------------------------------------------------
    def get(self, tenant: str, ref: str) -> ValueInfo:
        with self.connect() as db:
            return self._info(tenant, self._row(db, tenant, ref))

    def list(self, tenant: str) -> builtins.list[ValueInfo]:
        with self.connect() as db:
            rows = db.execute(
                "SELECT id, name, version, metadata, created_at, updated_at FROM e2b_secrets "
                "WHERE tenant=? ORDER BY created_at, id",
                (tenant,),
            ).fetchall()
        return [self._info(tenant, tuple(r)) for r in rows]

    def names(self, tenant: str) -> set[str]:
        with self.connect() as db:
            rows = db.execute("SELECT name FROM e2b_secrets WHERE tenant=?", (tenant,)).fetchall()
        return {r[0] for r in rows}

    def resolve(self, tenant: str, name: str) -> bytes | None:
        """The current value of ``tenant``'s secret ``name``, or None if there is none."""
        with self.connect() as db:
            row = db.execute(
                "SELECT id, version, key_id, nonce, ciphertext FROM e2b_secrets "
                "WHERE tenant=? AND name=?",
                (tenant, name.lower()),
            ).fetchone()
        if row is None:
            return None
        sid, version, key_id, nonce, sealed = row
        return self.keyring.unseal(
            f"secret {name!r} of tenant {tenant!r}",
            key_id,
            nonce,
            sealed,
            _aad(tenant, sid, version),
        )
