"""Tenant credentials in custody of the control plane: encrypted at rest, injected by the egress
proxy into HTTPS requests bound for the hosts a secret names, never shown to a sandbox.

Storage is one SQLite file (``data_dir/egress/secrets.db``). Values are sealed with AES-256-GCM;
the additional data binds each ciphertext to its tenant and name, so a row copied onto another
tenant's secret does not decrypt. Keys form a ring, newest first: the newest encrypts, all
decrypt (each ciphertext names its key), and ``rotate`` re-encrypts everything with the newest.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import hashlib
import json
import os
import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from sandhold.egress.header_rules import (
    FORBIDDEN_HEADERS,
    HEADER_RE,
    SECRET_REF,
    HeaderRule,
)
from sandhold.egress.kms import Kms, wrapped
from sandhold.egress.policy import host_matches, parse_rule
from sandhold.egress.refusal import refused
from sandhold.egress.secret_values import SecretValues
from sandhold.errors import InvalidRequest, NotFound, SecretKeyError

TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$")
SECRET_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
PLACEHOLDER = "{secret}"
MAX_VALUE = 16 * 1024


def new_key() -> str:
    return base64.urlsafe_b64encode(AESGCM.generate_key(bit_length=256)).decode()


def _key(text: str, kms: Kms | None) -> bytes:
    """A key as configured or filed: wrapped by ``kms`` (``kms:...``) or in clear."""
    if wrapped(text):
        if kms is None:
            raise SecretKeyError(
                "the secrets keys are wrapped by a KMS (kms:...): set secrets_kms_key_id"
            )
        return kms.unwrap(text)
    return _decode_key(text)


def _decode_key(text: str) -> bytes:
    try:
        raw = base64.urlsafe_b64decode(text.strip() + "=" * (-len(text.strip()) % 4))
    except ValueError:
        raise SecretKeyError("a secrets key is not valid base64") from None
    if len(raw) != 32:
        raise SecretKeyError("a secrets key must be 32 bytes (base64url); see `sandhold secret`")
    return raw


class KeyRing:
    """Keys newest first; ``key_id`` is a short hash that ciphertexts carry."""

    def __init__(self, keys: list[bytes], file: Path | None = None, kms: Kms | None = None) -> None:
        if not keys:
            raise SecretKeyError("no secrets key configured")
        self.keys = keys
        self.file = file
        self.kms = kms  # wraps the file's keys (egress/kms.py)
        self.by_id = {self.key_id(k): k for k in keys}

    @staticmethod
    def key_id(key: bytes) -> str:
        return hashlib.sha256(b"sandhold-secrets" + key).hexdigest()[:12]

    @property
    def current(self) -> tuple[str, bytes]:
        return self.key_id(self.keys[0]), self.keys[0]

    @classmethod
    def load(cls, configured: list[str], key_file: Path, kms: Kms | None = None) -> KeyRing:
        """Keys from the configuration if any, else from ``key_file`` (one per line, newest
        first), which is created with a fresh key on first use. With ``kms`` the keys are
        kept wrapped by it (``kms:...``) and unwrapped here."""
        if configured:
            return cls([_key(k, kms) for k in configured], kms=kms)
        if not key_file.exists():
            # Written aside, then linked into place: processes starting together (gateway
            # replicas, the server) never read a half-written file, and only one key wins.
            key_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = key_file.with_name(f"{key_file.name}.{os.getpid()}.new")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write((kms.new_key() if kms else new_key()) + "\n")
            with contextlib.suppress(FileExistsError):
                os.link(tmp, key_file)
            tmp.unlink()
        if key_file.stat().st_mode & 0o077:
            raise SecretKeyError(f"{key_file} must not be readable by group or others (chmod 600)")
        lines = [ln for ln in key_file.read_text().splitlines() if ln.strip()]
        if kms is not None and not all(wrapped(ln) for ln in lines):
            raise SecretKeyError(
                f"{key_file} holds a key in clear although secrets_kms_key_id is set: "
                "`sandhold secret wrap-keys` wraps them"
            )
        return cls([_key(k, kms) for k in lines], key_file, kms)

    def seal(self, plaintext: bytes, aad: bytes) -> tuple[str, bytes, bytes]:
        """AES-256-GCM under the newest key: (key id, nonce, ciphertext)."""
        key_id, key = self.current
        nonce = os.urandom(12)
        return key_id, nonce, AESGCM(key).encrypt(nonce, plaintext, aad)

    def open(self, key_id: str, nonce: bytes, sealed: bytes, aad: bytes) -> bytes:
        """The plaintext; SecretKeyError if ``key_id`` is not in the ring (any more), InvalidTag
        if the ciphertext or its associated data was changed."""
        key = self.by_id.get(key_id)
        if key is None:
            raise SecretKeyError(f"key {key_id} is not in the secrets key ring")
        return AESGCM(key).decrypt(nonce, sealed, aad)

    def unseal(self, what: str, key_id: str, nonce: bytes, sealed: bytes, aad: bytes) -> bytes:
        """As ``open``, but any failure is a SecretKeyError that says which ``what`` (a secret)
        failed and why, never the ciphertext."""
        try:
            return self.open(key_id, nonce, sealed, aad)
        except SecretKeyError:  # open raises it only for a key not in the ring
            raise SecretKeyError(
                f"{what} is sealed with key {key_id}, which is not configured any more"
            ) from None
        except Exception:
            raise SecretKeyError(f"{what} does not decrypt (tampered or moved)") from None

    def add_new_key(self) -> None:
        """Put a fresh key first (key file only; configured keys are the operator's to edit)."""
        if self.file is None:
            raise SecretKeyError(
                "the secrets keys come from the configuration (secrets_keys): put a new key "
                "first there (`sandhold secret new-key`), then run rotate-key to re-encrypt"
            )
        line = self.kms.new_key() if self.kms else new_key()
        self._write([line, *self.file.read_text().splitlines()])
        self.keys.insert(0, _key(line, self.kms))
        self.by_id = {self.key_id(k): k for k in self.keys}

    def wrap_file(self) -> int:
        """Wrap the key file's keys held in clear with the ring's KMS; how many it wrapped."""
        if self.file is None or self.kms is None:
            raise SecretKeyError("wrapping needs a key file and secrets_kms_key_id")
        lines = [ln for ln in self.file.read_text().splitlines() if ln.strip()]
        done = [ln if wrapped(ln) else self.kms.wrap(_decode_key(ln)) for ln in lines]
        self._write(done)
        return sum(1 for ln in lines if not wrapped(ln))

    def _write(self, lines: list[str]) -> None:
        assert self.file is not None
        tmp = self.file.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("".join(ln + "\n" for ln in lines))
        os.replace(tmp, self.file)


@dataclass
class SecretInfo:
    tenant: str
    name: str
    hosts: list[str]
    header: str
    format: str
    key_id: str
    created_at: float
    updated_at: float

    def to_json(self) -> dict[str, object]:
        return {
            "tenant": self.tenant,
            "name": self.name,
            "hosts": self.hosts,
            "header": self.header,
            "format": self.format,
            "key_id": self.key_id,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


@dataclass
class Injection:
    """What the proxy adds to one request: never logged, never returned by any API."""

    secret: str  # tenant/name, for the audit log
    header: str
    value: str
    raw: bytes  # the bare secret, redacted from responses
    more: tuple[bytes, ...] = ()  # further secrets in the same value (header rules)

    @property
    def secrets(self) -> tuple[bytes, ...]:
        return tuple(r for r in (self.raw, *self.more) if r)


def _aad(tenant: str, name: str) -> bytes:
    return f"sandhold-secret\0{tenant}\0{name}".encode()


class SecretStore:
    def __init__(self, db_path: Path, keyring: KeyRing) -> None:
        self.path = db_path
        self.keyring = keyring
        db_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with self._db() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS secrets (tenant TEXT NOT NULL, name TEXT NOT NULL, "
                "hosts TEXT NOT NULL, header TEXT NOT NULL, format TEXT NOT NULL, "
                "key_id TEXT NOT NULL, nonce BLOB NOT NULL, ciphertext BLOB NOT NULL, "
                "created_at REAL NOT NULL, updated_at REAL NOT NULL, PRIMARY KEY (tenant, name))"
            )
        os.chmod(db_path, 0o600)
        self.values = SecretValues(self._db, self.keyring)  # E2B's /secrets, in the same file

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=10)
        try:
            with db:
                yield db
        finally:
            db.close()

    def version(self) -> float:
        try:
            return self.path.stat().st_mtime_ns
        except FileNotFoundError:
            return 0

    # -- writing ------------------------------------------------------------------------------
    def set(
        self,
        tenant: str,
        name: str,
        value: str,
        hosts: list[str],
        header: str = "Authorization",
        format: str = "Bearer {secret}",
    ) -> SecretInfo:
        _validate(tenant, name, value, hosts, header, format)
        key_id, nonce, sealed = self.keyring.seal(value.encode(), _aad(tenant, name))
        now = time.time()
        with self._db() as db:
            row = db.execute(
                "SELECT created_at FROM secrets WHERE tenant=? AND name=?", (tenant, name)
            ).fetchone()
            created = row[0] if row else now
            db.execute(
                "INSERT OR REPLACE INTO secrets VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    tenant,
                    name,
                    json.dumps(hosts),
                    header,
                    format,
                    key_id,
                    nonce,
                    sealed,
                    created,
                    now,
                ),
            )
        return SecretInfo(tenant, name, hosts, header, format, key_id, created, now)

    def remove(self, tenant: str, name: str) -> None:
        with self._db() as db:
            n = db.execute("DELETE FROM secrets WHERE tenant=? AND name=?", (tenant, name)).rowcount
        if not n:
            raise NotFound(f"secret {name!r} of tenant {tenant!r} does not exist")

    def rotate(self) -> int:
        """Re-encrypt every secret with the newest key; returns how many were rewritten."""
        count = 0
        with self._db() as db:
            rows = db.execute(
                "SELECT tenant, name, key_id, nonce, ciphertext FROM secrets"
            ).fetchall()
            for tenant, name, old_id, nonce, sealed in rows:
                value = self._open(tenant, name, old_id, nonce, sealed)
                key_id, new_nonce, resealed = self.keyring.seal(value, _aad(tenant, name))
                db.execute(
                    "UPDATE secrets SET key_id=?, nonce=?, ciphertext=? WHERE tenant=? AND name=?",
                    (key_id, new_nonce, resealed, tenant, name),
                )
                count += 1
            count += self.values.rotate(db)
        return count

    # -- reading ------------------------------------------------------------------------------
    def list(self, tenant: str | None = None) -> list[SecretInfo]:
        q = (
            "SELECT tenant, name, hosts, header, format, key_id, created_at, updated_at "
            "FROM secrets"
        )
        args: tuple[str, ...] = ()
        if tenant is not None:
            q, args = q + " WHERE tenant=?", (tenant,)
        with self._db() as db:
            rows = db.execute(q + " ORDER BY tenant, name", args).fetchall()
        return [
            SecretInfo(r[0], r[1], json.loads(r[2]), r[3], r[4], r[5], r[6], r[7]) for r in rows
        ]

    def injections(self, tenant: str, host: str) -> builtins.list[Injection]:
        """The headers to add to a request from ``tenant``'s sandbox to ``host``."""
        out = []
        with self._db() as db:
            rows = db.execute(
                "SELECT name, hosts, header, format, key_id, nonce, ciphertext FROM secrets "
                "WHERE tenant=? ORDER BY name",
                (tenant,),
            ).fetchall()
        for name, hosts, header, fmt, key_id, nonce, sealed in rows:
            if not host_matches(json.loads(hosts), host):
                continue
            raw = self._open(tenant, name, key_id, nonce, sealed)
            value = fmt.replace(PLACEHOLDER, raw.decode())
            out.append(Injection(f"{tenant}/{name}", header, value, raw))
        return out

    def rule_injections(
        self, rules: builtins.list[HeaderRule], tenant: str, host: str
    ) -> builtins.list[Injection]:
        """What a sandbox's header rules that apply to ``host`` add to one request, with the
        tenant's E2B secrets resolved now. A secret deleted since the rule was set refuses the
        request: it is never sent without it. A later rule's header overrides an earlier one."""
        out: dict[str, Injection] = {}
        for rule in rules:
            if not host_matches([rule.host], host):
                continue
            for name, template in rule.headers.items():
                value, found = self._fill(tenant, template)
                label = f"{tenant}/" + ",".join(SECRET_REF.findall(template)) if found else "rule"
                first, *more = found or [b""]
                out[name.lower()] = Injection(label, name, value, first, tuple(more))
        return builtins.list(out.values())

    def _fill(self, tenant: str, template: str) -> tuple[str, builtins.list[bytes]]:
        """``template`` with each ``${e2b.secrets.NAME}`` replaced by its value; the values."""
        parts, found, at = [], [], 0
        for m in SECRET_REF.finditer(template):
            value = self.values.resolve(tenant, m.group(1))
            if value is None:
                raise refused(
                    502,
                    f"secret {m.group(1)!r} named by the sandbox's network.rules does not exist",
                    "secret",
                )
            parts += [template[at : m.start()], value.decode()]
            found.append(value)
            at = m.end()
        return "".join(parts) + template[at:], found

    def hosts_of(self, tenant: str) -> builtins.list[builtins.list[str]]:
        with self._db() as db:
            rows = db.execute("SELECT hosts FROM secrets WHERE tenant=?", (tenant,)).fetchall()
        return [json.loads(r[0]) for r in rows]

    def _open(self, tenant: str, name: str, key_id: str, nonce: bytes, sealed: bytes) -> bytes:
        what = f"secret {name!r} of tenant {tenant!r}"
        return self.keyring.unseal(what, key_id, nonce, sealed, _aad(tenant, name))


def _validate(tenant: str, name: str, value: str, hosts: list[str], header: str, fmt: str) -> None:
    if not TENANT_RE.match(tenant):
        raise InvalidRequest(f"tenant {tenant!r} must be 1-128 letters, digits or . _ @ : -")
    if not SECRET_NAME_RE.match(name):
        raise InvalidRequest(f"secret name {name!r} must be 1-128 letters, digits or . _ -")
    if not value or len(value) > MAX_VALUE:
        raise InvalidRequest(f"a secret value must be 1-{MAX_VALUE} characters")
    if any(c in value for c in "\r\n\0"):
        raise InvalidRequest("a secret value must not contain CR, LF or NUL")
    if not hosts:
        raise InvalidRequest("a secret needs at least one host (domain or *.domain) to inject into")
    for h in hosts:
        try:
            rule = parse_rule(h)
        except ValueError as e:
            raise InvalidRequest(str(e)) from None
        if rule.network is not None:
            raise InvalidRequest(f"secret host {h!r} must be a domain or *.domain, not an address")
    if not HEADER_RE.match(header) or header.lower() in FORBIDDEN_HEADERS:
        raise InvalidRequest(f"header {header!r} is not a header a secret may be injected into")
    if fmt.count(PLACEHOLDER) != 1 or any(c in fmt for c in "\r\n\0"):
        raise InvalidRequest(f"format must contain {PLACEHOLDER} exactly once and no line breaks")


def default_key_file(data_dir: Path) -> Path:
    return data_dir / "egress" / "secrets.key"


def ring_of(s: Any) -> KeyRing:
    """The key ring a configuration (Settings, EgressConfig) names: its ``secrets_keys``, else
    its key file, wrapped by its KMS if it has one."""
    return KeyRing.load(
        s.secrets_keys, s.secrets_key_file or default_key_file(s.data_dir), Kms.of(s)
    )


def open_store(s: Any) -> SecretStore:
    return SecretStore(s.data_dir / "egress" / "secrets.db", ring_of(s))
