"""The secrets key ring wrapped by a KMS (egress/kms.py), against a real KMS-compatible server on
loopback (moto's, server mode): the key file holds only wrapped keys; secrets sealed, the store
reopened as at a restart, the key rotated; a host that loses the KMS keeps injecting with the ring
it has and refuses to start again, saying why; a key file in clear is refused until
``sandhold secret wrap-keys`` wraps it."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from e2b import Sandbox
from e2b.sandbox.network import ALL_TRAFFIC
from moto.server import ThreadedMotoServer

from sandhold.config import Settings
from sandhold.egress.secrets import KeyRing, default_key_file, open_store
from sandhold.errors import SecretKeyError
from tests.support.e2b_server import new_server

TOKEN = "kms-wrapped-token-5e6f7a8b"


@pytest.fixture
def kms(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ThreadedMotoServer, dict[str, str]]]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        client = boto3.client("kms", endpoint_url=endpoint, region_name="us-east-1")
        key_id = client.create_key(Description="sandhold secrets")["KeyMetadata"]["KeyId"]
        yield (
            server,
            {
                "secrets_kms_key_id": key_id,
                "secrets_kms_endpoint_url": endpoint,
                "secrets_kms_region": "us-east-1",
            },
        )
    finally:
        server.stop()


def clear_keys(ring: KeyRing) -> list[str]:
    return [base64.urlsafe_b64encode(k).decode().rstrip("=") for k in ring.keys]


def test_a_wrapped_ring_seals_reopens_and_rotates(kms, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, wrap = kms
    settings = Settings(data_dir=tmp_path, **wrap)
    store = open_store(settings)
    store.set("acme", "api", "the-token-1234", ["api.example.test"])
    key_file = default_key_file(tmp_path)
    text = key_file.read_text()
    assert all(line.startswith("kms:") for line in text.splitlines())
    assert not any(k in text for k in clear_keys(store.keyring))  # never in clear on disk

    again = open_store(settings)  # a restart: the ring unwrapped by the KMS
    (injection,) = again.injections("acme", "api.example.test")
    assert injection.value == "Bearer the-token-1234"

    before = again.keyring.current[0]
    again.keyring.add_new_key()
    assert again.rotate() == 1
    lines = key_file.read_text().splitlines()
    assert len(lines) == 2 and all(line.startswith("kms:") for line in lines)
    rotated = open_store(settings)
    assert rotated.keyring.current[0] != before
    assert rotated.injections("acme", "api.example.test")[0].value == "Bearer the-token-1234"


def test_a_host_that_loses_the_kms_keeps_its_ring_and_refuses_to_restart(
    kms, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    server, wrap = kms
    settings = Settings(data_dir=tmp_path, **wrap)
    store = open_store(settings)
    store.set("acme", "api", "still-here", ["api.example.test"])
    server.stop()
    assert store.injections("acme", "api.example.test")[0].value == "Bearer still-here"
    with pytest.raises(SecretKeyError, match="could not unwrap the secrets key ring") as e:
        open_store(settings)
    assert wrap["secrets_kms_key_id"] in e.value.message
    server.start()  # (the fixture stops it)


def test_a_key_file_in_clear_is_refused_until_wrapped(kms, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, wrap = kms
    plain = open_store(Settings(data_dir=tmp_path))  # made before the KMS was configured
    plain.set("acme", "api", "older-token", ["api.example.test"])
    key_file = default_key_file(tmp_path)
    clear = key_file.read_text().strip()
    with pytest.raises(SecretKeyError, match="wrap-keys"):
        open_store(Settings(data_dir=tmp_path, **wrap))
    env = {
        **os.environ,
        "SANDHOLD_DATA_DIR": str(tmp_path),
        **{f"SANDHOLD_{k.upper()}": v for k, v in wrap.items()},
    }
    r = subprocess.run([sys.executable, "-m", "sandhold.cli", "secret", "wrap-keys"],
                       env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0 and "wrapped 1 key" in r.stdout, r.stdout + r.stderr
    assert clear not in key_file.read_text()
    wrapped = open_store(Settings(data_dir=tmp_path, **wrap))
    assert wrapped.injections("acme", "api.example.test")[0].value == "Bearer older-token"
    with pytest.raises(SecretKeyError, match="set secrets_kms_key_id"):
        open_store(Settings(data_dir=tmp_path))  # wrapped keys, no KMS named


def test_egress_injects_with_a_wrapped_ring_across_a_restart(kms, tmp_path: Path, internet) -> None:  # type: ignore[no-untyped-def]
    """End to end: a secret set with a KMS-wrapped ring is injected by the egress proxy into a
    sandbox's request, before and after the server restarts (its daemon unwraps the ring
    again); the sandbox never sees it."""
    _, wrap = kms
    srv = new_server(tmp_path, egress_e2b_enabled="true", **internet.server_settings(), **wrap)
    srv.start()
    try:
        open_store(Settings(data_dir=srv.data_dir, **wrap)).set(
            "team-a", "token", TOKEN, ["api.example.test"]
        )
        for _ in range(2):
            sbx = Sandbox.create(
                timeout=120,
                network={"allow_out": ["api.example.test"], "deny_out": [ALL_TRAFFIC]},
                **srv.sdk(),
            )
            try:
                r = sbx.commands.run("curl -sS --max-time 10 https://api.example.test/auth")
                assert (
                    r.stdout
                    == "auth-sha256=" + hashlib.sha256(f"Bearer {TOKEN}".encode()).hexdigest()
                )
                assert TOKEN not in sbx.commands.run("env").stdout
            finally:
                sbx.kill()
            srv.stop()  # a restart: the egress daemon unwraps the ring again
            srv.start()
        assert "kms:" in default_key_file(srv.data_dir).read_text()
    finally:
        srv.destroy()
