"""The settings: one flat object built from four layers, the TOML file's sections, and the
half-configurations refused at construction or at a process's start-up (through the real CLI)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandhold.config import (
    LAYERS,
    EgressSettings,
    GatewaySettings,
    RuntimeSettings,
    ServerSettings,
    Settings,
    load,
)
from sandhold.errors import ConfigError

LONG_KEY = "a-tenant-key-0123456789"
SECTIONS = """
[runtime]
data_dir = "/srv/sandhold"
default_memory_mb = 1024

[server]
host = "10.0.0.5"
port = 40000
api_keys = { "sk-team-a" = "team-a" }
public_domain = "sbx.example.com"

[egress]
e2b_enabled = true
e2b_default = "open"
open_cidrs = ["10.9.0.0/16"]
secrets_key_file = "/etc/sandhold/secrets.key"

[gateway]
port = 49991
provider = "e2b"
e2b_api_url = "http://10.0.0.5:40000"
s3_prefix = "out/"

[gateway.tenants.acme]
api_key = "acme-secret-key-123456"
policy = { keep_alive_s = 60 }
"""
# what the file used to be: one [runtime] table holding whole names of every layer
ONE_RUNTIME_TABLE = """
[runtime]
data_dir = "/srv/old"
gateway_port = 49993
api_keys = { "sk-a" = "a" }
egress_e2b_enabled = true
"""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("SANDHOLD_"):
            monkeypatch.delenv(name)


def write_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> Path:
    path = tmp_path / "sandhold.toml"
    path.write_text(text)
    monkeypatch.setenv("SANDHOLD_CONFIG", str(path))
    return path


# -- the layers and the environment ------------------------------------------------------------
def test_the_layers_partition_the_flat_fields() -> None:
    per_layer = [set(layer.model_fields) for layer in LAYERS]
    assert set().union(*per_layer) == set(Settings.model_fields)
    assert sum(len(f) for f in per_layer) == len(Settings.model_fields)  # no field in two layers
    assert {"data_dir", "uid_base", "ready_timeout_s"} <= set(RuntimeSettings.model_fields)
    assert {"server_host", "api_keys", "host_mount_roots"} <= set(ServerSettings.model_fields)
    assert {"egress_e2b_enabled", "secrets_keys"} <= set(EgressSettings.model_fields)
    assert {"gateway_port", "gateway_tenants"} <= set(GatewaySettings.model_fields)


@pytest.mark.parametrize(
    ("env", "value", "field", "expected"),
    [
        ("SANDHOLD_DATA_DIR", "/srv/sandhold", "data_dir", Path("/srv/sandhold")),
        ("SANDHOLD_UID_BASE", "200000", "uid_base", 200000),
        ("SANDHOLD_SERVER_PORT", "40000", "server_port", 40000),
        ("SANDHOLD_API_KEYS", '{"sk-a": "team-a"}', "api_keys", {"sk-a": "team-a"}),
        ("SANDHOLD_EGRESS_E2B_ENABLED", "true", "egress_e2b_enabled", True),
        ("SANDHOLD_SECRETS_KEYS", '["k1"]', "secrets_keys", ["k1"]),
        ("SANDHOLD_GATEWAY_PORT", "49991", "gateway_port", 49991),
        ("SANDHOLD_GATEWAY_S3_PREFIX", "out/", "gateway_s3_prefix", "out/"),
    ],
)
def test_environment_names_are_unchanged(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, field: str, expected: Any
) -> None:
    monkeypatch.setenv(env, value)
    assert getattr(load(), field) == expected
    assert getattr(Settings(), field) == expected


def test_every_field_is_read_from_sandhold_and_its_name() -> None:
    assert Settings.model_config["env_prefix"] == "SANDHOLD_"
    for name, info in Settings.model_fields.items():
        assert info.alias is None and info.validation_alias is None, name


def test_an_invalid_value_is_a_config_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SANDHOLD_GATEWAY_PORT", "not-a-port")
    with pytest.raises(ConfigError, match=r"gateway_port \(SANDHOLD_GATEWAY_PORT\)"):
        load()
    monkeypatch.setenv("SANDHOLD_GATEWAY_PORT", "49990")
    monkeypatch.setenv("SANDHOLD_API_KEYS", "{not json")
    with pytest.raises(ConfigError, match="api_keys"):
        load()
    monkeypatch.delenv("SANDHOLD_API_KEYS")
    with pytest.raises(ConfigError, match="unknown setting 'no_such_setting'"):
        load(no_such_setting=1)


# -- the TOML file -----------------------------------------------------------------------------
def test_toml_sections(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(tmp_path, monkeypatch, SECTIONS)
    s = load()
    assert s.data_dir == Path("/srv/sandhold") and s.default_memory_mb == 1024
    assert (s.server_host, s.server_port) == ("10.0.0.5", 40000)
    assert s.api_keys == {"sk-team-a": "team-a"} and s.public_domain == "sbx.example.com"
    assert s.egress_e2b_enabled and s.egress_e2b_default == "open"
    assert s.egress_open_cidrs == ["10.9.0.0/16"]
    assert s.secrets_key_file == Path("/etc/sandhold/secrets.key")
    assert (s.gateway_port, s.gateway_provider) == (49991, "e2b")
    assert s.gateway_e2b_api_url == "http://10.0.0.5:40000" and s.gateway_s3_prefix == "out/"
    assert s.gateway_tenants["acme"]["policy"] == {"keep_alive_s": 60}
    assert s.gateway_port != s.server_port  # [gateway] port and [server] port are two fields


def test_the_old_forms_still_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(tmp_path, monkeypatch, 'gateway_port = 49992\nserver_host = "127.0.0.2"\n')
    assert (load().gateway_port, load().server_host) == (49992, "127.0.0.2")
    write_config(tmp_path, monkeypatch, ONE_RUNTIME_TABLE)
    s = load()
    assert s.data_dir == Path("/srv/old") and s.gateway_port == 49993
    assert s.api_keys == {"sk-a": "a"} and s.egress_e2b_enabled


def test_sources_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDHOLD_GATEWAY_PORT", "40001")
    monkeypatch.setenv("SANDHOLD_SERVER_PORT", "40002")
    assert load().gateway_port == 40001  # the environment alone
    write_config(tmp_path, monkeypatch, "[gateway]\nport = 40003\n")
    s = load()
    assert (s.gateway_port, s.server_port) == (40003, 40002)  # the file over the environment
    assert load(gateway_port=40004).gateway_port == 40004  # the command line over both


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[gateway]\nbogus = 1\n", "unknown key 'bogus' in [gateway]"),
        ("[gateway]\ngateway_port = 1\n", "write it as 'port'"),
        ("[server]\nserver_host = '0.0.0.0'\n", "write it as 'host'"),
        ("[server]\nsecrets_keys = []\n", "in [server]: it is a key of [egress]"),
        ("[egress]\ngateway_port = 1\n", "it is 'port' in [gateway]"),
        ("[runtime]\nbogus = 1\n", "unknown key 'bogus' in [runtime]"),
        ("[gateways]\nport = 1\n", "unknown key or section 'gateways'"),
        ("bogus = 1\n", "unknown key or section 'bogus'"),
        ("gateway = 1\n", "gateway must be a section"),
        ("gateway_port = 1\n[gateway]\nport = 2\n", "gateway_port is set twice"),
        ("[gateway]\nport = 'x'\n", "gateway_port (SANDHOLD_GATEWAY_PORT)"),
        ("[gateway\n", "is not TOML"),
    ],
)
def test_unknown_keys_and_sections_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, message: str
) -> None:
    path = write_config(tmp_path, monkeypatch, text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load()
    if "TOML" not in message and "SANDHOLD_GATEWAY_PORT" not in message:
        with pytest.raises(ConfigError, match=re.escape(str(path))):  # names the file too
            load()


def test_a_missing_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDHOLD_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match="cannot read the settings file"):
        load()


def test_section_keys_are_unambiguous() -> None:
    sections = [layer.toml_section for layer in LAYERS]
    assert sections == ["runtime", "server", "egress", "gateway", "logs", "worker", "fleet"]
    assert not set(sections) & set(Settings.model_fields)  # a section is never a field's name
    for layer in LAYERS:
        assert len(layer.toml_keys()) == len(layer.model_fields), layer  # no two fields collide


# -- half-configurations refused for every process ----------------------------------------------
@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"gateway_provider": "e2b"}, "the e2b provider needs gateway_e2b_api_url"),
        ({"gateway_deliverables": "s3"}, "gateway_deliverables=s3 needs gateway_s3_bucket"),
        ({"egress_e2b_default": "open"}, "egress_e2b_default=open needs egress_e2b_enabled"),
        ({"egress_open_cidrs": ["10.0.0.0/33"]}, "'10.0.0.0/33' is not an IP network"),
        ({"egress_hosts": {"api.test": ["api.test"]}}, "which is not an IP address"),
        ({"gateway_admin_key": "short"}, "gateway_admin_key must be at least 16 characters"),
        ({"gateway_tenants": {"acme": {"apikey": LONG_KEY}}}, "unknown key 'apikey'"),
        ({"gateway_tenants": {"acme": {"api_key": "short"}}}, "at least 16 characters"),
        ({"gateway_tenants": {"acme": {"policy": "open"}}}, "must be an object"),
    ],
)
def test_half_configurations_are_refused(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        Settings(**values)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load(**values)


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"data_dir": "/tmp/x"},
        {"gateway_provider": "e2b", "gateway_e2b_api_url": "http://127.0.0.1:49982"},
        {"gateway_deliverables": "s3", "gateway_s3_bucket": "b"},
        {"egress_e2b_enabled": True, "egress_e2b_default": "open"},
        {"egress_open_cidrs": ["10.9.0.0/16", "fd00::/8"], "egress_hosts": {"a.test": ["::1"]}},
        {"gateway_tenants": {"acme": {"api_key": LONG_KEY, "policy": {}}, "stdio": {}}},
        {"server_host": "0.0.0.0"},  # refused by `sandhold serve`, not by every process
    ],
)
def test_complete_or_partial_settings_are_accepted(values: dict[str, Any]) -> None:
    Settings(**values)


# -- checks of one process's start-up -----------------------------------------------------------
def test_the_server_refuses_an_open_api_off_loopback() -> None:
    s = Settings()
    for host in ("127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.9"):
        s.check_server_serve(host)
    with pytest.raises(ConfigError, match=r"refusing to listen on 0\.0\.0\.0") as e:
        s.check_server_serve("0.0.0.0")
    assert "SANDHOLD_API_KEYS" in e.value.message
    Settings(api_keys={"sk-a": "a"}).check_server_serve("0.0.0.0")


def test_the_gateway_refuses_workspaces_that_die_with_sandboxes() -> None:
    with pytest.raises(ConfigError, match="set gateway_allow_ephemeral_workspace=true"):
        Settings().check_gateway_serve("e2b", mounts_workspaces=False)
    Settings().check_gateway_serve("local", mounts_workspaces=True)
    Settings(gateway_allow_ephemeral_workspace=True).check_gateway_serve("e2b", False)


# -- through the real CLI ------------------------------------------------------------------------
@pytest.fixture
def port() -> Iterator[int]:
    """A loopback port held bound (not listening) by the test while the CLI runs: nobody else
    can take it, and a server that went ahead anyway would fail to bind it instead of
    listening, so neither a stranger nor a regression passes for "nothing listens"."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def cli(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_")}
    base.update(SANDHOLD_DATA_DIR=str(tmp_path / "data"), SANDHOLD_PREBUILD_TEMPLATES="[]")
    return subprocess.run(
        [sys.executable, "-m", "sandhold.cli", *args], env={**base, **env},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def refused(r: subprocess.CompletedProcess[str], port: int, message: str) -> None:
    assert r.returncode == 78, r.stderr  # ConfigError's exit status (sandhold.cli.errors)
    assert "error (invalid_config):" in r.stderr and message in " ".join(r.stderr.split())
    assert "Traceback" not in r.stderr and "Uvicorn running" not in r.stderr
    assert not listening(port)


def test_cli_serve_refuses_an_open_api_on_a_public_address(tmp_path: Path, port: int) -> None:
    r = cli(tmp_path, "serve", "--host", "0.0.0.0", "--port", str(port))
    refused(r, port, "refusing to listen on 0.0.0.0: no API keys are configured")
    assert "SANDHOLD_API_KEYS" in r.stderr


def test_cli_gateway_serve_refuses_half_configurations(tmp_path: Path, port: int) -> None:
    r = cli(tmp_path, "gateway", "serve", "--port", str(port), SANDHOLD_GATEWAY_PROVIDER="e2b")
    refused(r, port, "the e2b provider needs gateway_e2b_api_url")
    r = cli(tmp_path, "gateway", "serve", "--port", str(port), SANDHOLD_GATEWAY_DELIVERABLES="s3")
    refused(r, port, "gateway_deliverables=s3 needs gateway_s3_bucket")
    # decided once the provider is known, still before anything listens
    r = cli(
        tmp_path, "gateway", "serve", "--port", str(port), SANDHOLD_GATEWAY_PROVIDER="e2b",
        SANDHOLD_GATEWAY_E2B_API_URL="http://127.0.0.1:9", SANDHOLD_GATEWAY_E2B_FLAVOR="e2b",
    )  # fmt: skip
    refused(r, port, "the e2b provider cannot mount workspaces")
    config = tmp_path / "sandhold.toml"
    config.write_text("[gateway]\ngateway_port = 1\n")
    r = cli(tmp_path, "gateway", "serve", "--port", str(port), SANDHOLD_CONFIG=str(config))
    refused(r, port, "unknown key 'gateway_port' in [gateway]")
