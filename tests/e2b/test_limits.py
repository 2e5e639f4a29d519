"""Every input of the API is bounded (docs/e2b.md, "Limits"): past a limit the answer is a 400
(413 for a body) whose message names the limit's setting, and nothing is created or changed.
Before the limits, 3,000 environment variables of 1 KB made a sandbox in which every command
failed with "argument list too long", and a negative set_timeout killed the sandbox."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import InvalidArgumentException, Sandbox, SandboxException

from sandhold.config import Settings
from sandhold.e2b.creates import host_mounts
from sandhold.errors import InvalidRequest
from tests.support.e2b_server import Server

KB = "x" * 1024


def state(server: Server, api: httpx.Client) -> tuple[list[str], list[str]]:
    ids = sorted(s["sandboxID"] for s in api.get("/v2/sandboxes").json())
    dirs = sorted(p.name for p in (server.data_dir / "sandboxes").iterdir())
    return ids, dirs


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[httpx.Client]:
    with server.api() as c:
        yield c


@pytest.fixture(scope="module")
def volume(client: httpx.Client) -> Iterator[str]:
    name = "limits-vol"
    vol = client.post("/volumes", json={"name": name}).json()
    yield name
    client.delete(f"/volumes/{vol['volumeID']}")


def create(client: httpx.Client, headers: dict[str, str] | None = None, **body: Any
           ) -> httpx.Response:  # fmt: skip
    return client.post("/v2/sandboxes", json={"templateID": "base", **body}, headers=headers)


def refused(r: httpx.Response, setting: str, status: int = 400) -> None:
    assert r.status_code == status, r.text
    err = r.json()
    assert err["code"] == status and setting in err["message"], err
    assert len(err["message"]) < 400, err  # an oversized value is never echoed whole


def test_3000_env_vars_of_1kb_are_refused_and_create_nothing(
    server: Server, client: httpx.Client
) -> None:
    before = state(server, client)
    envs = {f"VAR_{i}": KB for i in range(3000)}
    with pytest.raises(SandboxException) as exc:
        Sandbox.create(envs=envs)
    assert exc.value.status_code == 400 and "sandbox_env_max_vars" in str(exc.value)
    assert state(server, client) == before


@pytest.mark.parametrize(
    ("envs", "setting"),
    [
        ({f"VAR_{i}": KB for i in range(300)}, "sandbox_env_max_bytes"),  # 300 KiB in all
        ({"BIG": "x" * (33 * 1024)}, "sandbox_env_max_value_bytes"),
        ({"N" * 300: "x"}, "sandbox_env_max_name_bytes"),
    ],
)
def test_env_limits(server: Server, client: httpx.Client, envs: dict[str, str], setting: str
                    ) -> None:  # fmt: skip
    before = state(server, client)
    refused(create(client, envVars=envs), setting)
    assert state(server, client) == before


def test_env_within_the_limits_reaches_every_command(server: Server) -> None:
    envs = {f"VAR_{i}": "y" * 500 for i in range(400)}  # 400 variables, about 200 KiB
    with Sandbox.create(envs=envs) as sbx:
        r = sbx.commands.run("echo ${#VAR_399}; env | grep -c ^VAR_")
        assert r.stdout.split() == ["500", "400"]


def test_3000_env_vars_of_1kb_on_a_command_are_refused_and_the_sandbox_works(
    server: Server,
) -> None:
    """A command's envs (envd's Start request) get the bounds of a create's, as envd answers an
    invalid argument (Connect's invalid_argument: the SDK's InvalidArgumentException); nothing is
    started, and the sandbox goes on working."""
    with Sandbox.create() as sbx:
        for background in (False, True):
            with pytest.raises(InvalidArgumentException) as exc:
                sbx.commands.run("touch /tmp/ran", envs={f"VAR_{i}": KB for i in range(3000)},
                                 background=background)  # fmt: skip
            message = str(exc.value)
            assert "process.envs" in message and "sandbox_env_max_vars" in message, message
            assert len(message) < 400  # the oversized value is not echoed
        for envs, setting in [
            ({f"VAR_{i}": KB for i in range(300)}, "sandbox_env_max_bytes"),  # 300 KiB in all
            ({"BIG": "x" * (33 * 1024)}, "sandbox_env_max_value_bytes"),
            ({"N" * 300: "x"}, "sandbox_env_max_name_bytes"),
        ]:
            with pytest.raises(InvalidArgumentException, match=setting):
                sbx.commands.run("touch /tmp/ran", envs=envs)
        r = sbx.commands.run("ls /tmp/ran 2>&1; echo alive", envs={"A": "1"})
        assert r.stdout.split("\n")[-2] == "alive" and "No such file" in r.stdout, r.stdout
        within = {f"VAR_{i}": "y" * 500 for i in range(400)}  # about 200 KiB: allowed
        r = sbx.commands.run("echo ${#VAR_399}; env | grep -c ^VAR_", envs=within)
        assert r.stdout.split() == ["500", "400"]


@pytest.mark.parametrize(
    ("metadata", "setting"),
    [
        ({f"k{i}": "v" for i in range(129)}, "sandbox_metadata_max_keys"),
        ({"k" * 257: "v"}, "sandbox_metadata_max_key_bytes"),
        ({"k": "v" * (8 * 1024 + 1)}, "sandbox_metadata_max_value_bytes"),
        ({f"k{i}": "v" * 8000 for i in range(9)}, "sandbox_metadata_max_bytes"),  # 72 KB
    ],
)
def test_metadata_limits(server: Server, client: httpx.Client, metadata: dict[str, str],
                         setting: str) -> None:  # fmt: skip
    before = state(server, client)
    refused(create(client, metadata=metadata), setting)
    with pytest.raises(SandboxException) as exc:
        Sandbox.create(metadata=metadata)
    assert exc.value.status_code == 400 and setting in str(exc.value)
    assert state(server, client) == before


def test_negative_set_timeout_is_refused_and_changes_nothing(client: httpx.Client) -> None:
    with Sandbox.create(timeout=600) as sbx:
        end_at = sbx.get_info().end_at
        r = client.post(f"/sandboxes/{sbx.sandbox_id}/timeout", json={"timeout": -5})
        assert r.status_code == 400 and "must not be negative" in r.json()["message"], r.text
        with pytest.raises(SandboxException) as exc:
            sbx.set_timeout(-1)
        assert exc.value.status_code == 400
        time.sleep(1.5)  # a timer tick or two: a refused timeout must not have been applied
        assert sbx.is_running() and sbx.get_info().end_at == end_at
        assert sbx.commands.run("echo alive").stdout == "alive\n"


def test_set_timeout_zero_ends_the_sandbox_now_as_in_e2b(server: Server) -> None:
    sbx = Sandbox.create(timeout=600)
    sbx.set_timeout(0)  # E2B: endAt = now, so the timer kills it (it was created to be killed)
    deadline = time.monotonic() + 30
    while (server.data_dir / "sandboxes" / sbx.sandbox_id).exists():  # killed and removed
        assert time.monotonic() < deadline, "set_timeout(0) did not end the sandbox"
        time.sleep(0.2)
    assert not sbx.is_running()


@pytest.mark.parametrize(
    ("body", "setting"),
    [
        ({"templateID": "t" * 10_000}, "1-64 letters"),
        ({"volumeMounts": [{"name": "limits-vol", "path": "/mnt/" + "p" * 5000}]},
         "sandbox_max_path_bytes"),
        ({"volumeMounts": [{"name": "limits-vol", "path": f"/mnt/v{i}"} for i in range(33)]},
         "sandbox_max_mounts"),
        ({"metadata": {"sandhold.file-view": json.dumps({"read": ["/" + "r" * 5000]})}},
         "sandbox_max_path_bytes"),
        ({"metadata": {"sandhold.file-view": json.dumps({"read": [f"/r{i}" for i in range(33)]})}},
         "sandbox_file_view_max_roots"),
        ({"envVars": {"9" * 10_000: "x"}}, "sandbox_env_max_name_bytes"),
    ],
)  # fmt: skip
def test_oversized_paths_names_and_lists(
    server: Server, client: httpx.Client, volume: str, body: dict[str, Any], setting: str
) -> None:
    before = state(server, client)
    refused(create(client, **body), setting)
    assert state(server, client) == before


def test_oversized_wire_fields(server: Server, client: httpx.Client) -> None:
    before = state(server, client)
    refused(create(client, headers={"Idempotency-Key": "i" * 256}),
            "server_max_idempotency_key_chars")  # fmt: skip
    refused(client.get("/v2/sandboxes", params={"metadata": "k=" + "v" * 9000}),
            "server_max_query_bytes")  # fmt: skip
    refused(client.post("/volumes", json={"name": "n" * 10_000}), "1-64 letters")
    big = b'{"templateID": "base", "metadata": {"k": "' + b"v" * (4 << 20) + b'"}}'
    refused(client.post("/v2/sandboxes", content=big), "server_max_body_bytes", 413)
    assert state(server, client) == before
    assert all(len(v["name"]) <= 64 for v in client.get("/volumes").json())


def test_host_mount_entries_are_bounded_before_the_host_is_looked_at(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, host_mount_roots=[tmp_path])
    long_path = json.dumps([{"hostPath": str(tmp_path / ("h" * 5000)), "mountPath": "/mnt/h"}])
    with pytest.raises(InvalidRequest, match="sandbox_max_path_bytes"):
        host_mounts(settings, long_path)
    many = json.dumps([{"hostPath": str(tmp_path), "mountPath": f"/mnt/m{i}"} for i in range(33)])
    with pytest.raises(InvalidRequest, match="sandbox_max_mounts"):
        host_mounts(settings, many)
    nul = json.dumps([{"hostPath": str(tmp_path) + "\0x", "mountPath": "/mnt/n"}])
    with pytest.raises(InvalidRequest, match="NUL"):
        host_mounts(settings, nul)
