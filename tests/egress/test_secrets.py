"""The secret store: sealed at rest, bound to tenant and name, key rotation, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandhold.config import Settings
from sandhold.egress.secrets import KeyRing, SecretKeyError, SecretStore, new_key, open_store
from sandhold.errors import InvalidRequest, NotFound


@pytest.fixture
def store(tmp_path: Path) -> SecretStore:
    return open_store(Settings(data_dir=tmp_path))


def test_values_are_sealed_and_injected_only_for_their_hosts(store: SecretStore) -> None:
    store.set(
        "t1",
        "gh",
        "ghp_value_1234",
        ["api.github.test", "*.gh.test"],
        header="X-Token",
        format="token {secret}",
    )
    assert b"ghp_value_1234" not in store.path.read_bytes()
    inj = store.injections("t1", "a.gh.test")
    assert [(i.header, i.value) for i in inj] == [("X-Token", "token ghp_value_1234")]
    assert store.injections("t1", "gh.test") == []
    assert store.injections("t2", "api.github.test") == []
    assert [i.name for i in store.list()] == ["gh"]
    assert "ghp_value_1234" not in json.dumps([i.to_json() for i in store.list()])


@pytest.mark.parametrize(
    "kwargs,msg",
    [
        ({"tenant": "bad tenant"}, "tenant"),
        ({"value": "a\r\nX-Evil: 1"}, "CR, LF"),
        ({"hosts": []}, "at least one host"),
        ({"hosts": ["10.0.0.0/8"]}, "not an address"),
        ({"header": "Host"}, "not a header"),
        ({"format": "Bearer"}, "exactly once"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_stored(store: SecretStore, kwargs, msg) -> None:
    args = {"tenant": "t", "name": "n", "value": "v-123456", "hosts": ["a.test"], **kwargs}
    with pytest.raises(InvalidRequest, match=msg):
        store.set(**args)
    assert store.list() == []
    with pytest.raises(NotFound):
        store.remove("t", "n")


def test_key_rotation_keeps_every_secret_readable(tmp_path: Path, store: SecretStore) -> None:
    store.set("t", "a", "value-aaaa", ["a.test"])
    old_id = store.keyring.current[0]
    store.keyring.add_new_key()
    assert store.list()[0].key_id == old_id  # old ciphertexts still decrypt
    assert store.injections("t", "a.test")[0].raw == b"value-aaaa"
    assert store.rotate() == 1
    assert store.list()[0].key_id == store.keyring.current[0] != old_id
    # once rotated, the old key can go
    lines = (tmp_path / "egress" / "secrets.key").read_text().splitlines()
    (tmp_path / "egress" / "secrets.key").write_text(lines[0] + "\n")
    fresh = open_store(Settings(data_dir=tmp_path))
    assert fresh.injections("t", "a.test")[0].raw == b"value-aaaa"


def test_rotation_reseals_e2b_secrets_too(tmp_path: Path, store: SecretStore) -> None:
    made = store.values.create("team", "api", "e2b-value-1")
    store.values.update("team", made.id, "e2b-value-2")
    store.keyring.add_new_key()
    assert store.rotate() == 1
    lines = (tmp_path / "egress" / "secrets.key").read_text().splitlines()
    (tmp_path / "egress" / "secrets.key").write_text(lines[0] + "\n")
    assert open_store(Settings(data_dir=tmp_path)).values.resolve("team", "API") == b"e2b-value-2"
    # a sealed value moved onto another secret's row does not open
    with store._db() as db:
        db.execute("UPDATE e2b_secrets SET tenant='other'")
    with pytest.raises(SecretKeyError, match="does not decrypt"):
        open_store(Settings(data_dir=tmp_path)).values.resolve("other", "api")


def test_a_missing_key_is_a_clear_error(tmp_path: Path) -> None:
    one = open_store(Settings(data_dir=tmp_path, secrets_keys=[new_key()]))
    one.set("t", "a", "value-aaaa", ["a.test"])
    other = SecretStore(one.path, KeyRing.load([new_key()], tmp_path / "unused"))
    with pytest.raises(SecretKeyError, match="not configured any more"):
        other.injections("t", "a.test")
    with pytest.raises(SecretKeyError, match="32 bytes"):
        KeyRing.load(["c2hvcnQ="], tmp_path / "x")


def test_cli_set_ls_rm_rotate(tmp_path: Path) -> None:
    env = {**os.environ, "SANDHOLD_DATA_DIR": str(tmp_path)}
    cli = [sys.executable, "-m", "sandhold.cli", "secret"]

    def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cli, *args], input=stdin, env=env, capture_output=True, text=True, timeout=60
        )

    r = run("set", "acme", "tok", "--host", "api.example.test", stdin="cli-secret-value\n")
    assert r.returncode == 0, r.stderr
    r = run("ls", "--json")
    assert json.loads(r.stdout)[0]["hosts"] == ["api.example.test"]
    assert "cli-secret-value" not in r.stdout
    r = run("rotate-key")
    assert r.returncode == 0 and "re-encrypted 1 secret" in r.stdout
    assert len((tmp_path / "egress" / "secrets.key").read_text().split()) == 2
    r = run("set", "acme", "tok", "--host", "1.2.3.4", stdin="x-123456\n")
    assert r.returncode == 65 and "not an address" in r.stderr  # InvalidRequest (cli.errors)
    assert run("rm", "acme", "tok").returncode == 0
    r = run("rm", "acme", "tok")
    assert r.returncode == 66 and "does not exist" in r.stderr  # NotFound
