"""The deployment's egress CA: generated once under ``data_dir/egress/ca``, trusted by every
sandbox with egress, and used by the proxy only to terminate TLS for hosts that have a
credential-injection rule (every other host is tunnelled untouched)."""

from __future__ import annotations

import datetime as dt
import fcntl
import ipaddress
import os
import socket
import ssl
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LEAF_CACHE = 256
LEAF_DAYS = 30


def _name(cn: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Sandhold"),
            x509.NameAttribute(NameOID.COMMON_NAME, cn),
        ]
    )


class DeploymentCA:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.cert_path = directory / "ca.crt"
        self.key_path = directory / "ca.key"
        self._lock = threading.Lock()
        self._leaves: OrderedDict[str, ssl.SSLContext] = OrderedDict()
        self._ensure()
        self.key = serialization.load_pem_private_key(self.key_path.read_bytes(), None)
        self.cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())

    def _ensure(self) -> None:
        if self.cert_path.exists() and self.key_path.exists():
            return
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # One maker at a time, in any process (two builds' first egress at once raced here and
        # failed: tests/compat), and none once it is made.
        fd = os.open(self.dir / "ca.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not (self.cert_path.exists() and self.key_path.exists()):
                self._make()
        finally:
            os.close(fd)

    def _make(self) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        name = _name(f"Sandhold egress CA ({socket.gethostname()})")
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        # Both under temporary names first: a reader (without the lock) sees the key alone at
        # most, which it does not take (it waits for the lock, then finds both).
        tmp_key = self.key_path.with_suffix(".key.tmp")
        fd = os.open(tmp_key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key_pem)
        tmp_cert = self.cert_path.with_suffix(".crt.tmp")
        tmp_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        os.replace(tmp_key, self.key_path)
        os.replace(tmp_cert, self.cert_path)

    def cert_pem(self) -> bytes:
        return self.cert_path.read_bytes()

    def server_context(self, host: str) -> ssl.SSLContext:
        """A TLS server context presenting a leaf certificate for ``host``."""
        with self._lock:
            ctx = self._leaves.get(host)
            if ctx is not None:
                self._leaves.move_to_end(host)
                return ctx
        ctx = self._make_leaf(host)
        with self._lock:
            self._leaves[host] = ctx
            while len(self._leaves) > LEAF_CACHE:
                self._leaves.popitem(last=False)
        return ctx

    def _make_leaf(self, host: str) -> ssl.SSLContext:
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        try:
            san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            san = x509.DNSName(host)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(host))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=LEAF_DAYS))
            .add_extension(x509.SubjectAlternativeName([san]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.cert.public_key()),  # type: ignore[arg-type]
                critical=False,
            )
            .sign(self.key, hashes.SHA256())  # type: ignore[arg-type]
        )
        pem = cert.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])
        # load_cert_chain reads files only: a private, immediately removed temporary file.
        with tempfile.NamedTemporaryFile(dir=self.dir, prefix=".leaf-", suffix=".pem") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(pem)
            f.flush()
            ctx.load_cert_chain(f.name)
        return ctx
