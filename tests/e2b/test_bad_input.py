"""Bad input gets the right status and a JSON {code, message} naming the problem, and changes
nothing: the sandbox list and the runtime's sandbox directories are the same afterwards."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from e2b import AuthenticationException, Sandbox, SandboxQuery

from tests.support.e2b_server import KEY_A, Server
from tests.support.http import announced

GHOST = "a" * 20  # well-formed, but no such sandbox

CASES = [
    # (method, path, body, status, fragment of the message)
    ("POST", "/v2/sandboxes", b'{"templateID": "base",', 400, "not valid JSON"),
    ("POST", "/v2/sandboxes", b"", 400, "not valid JSON"),
    ("POST", "/v2/sandboxes", b"[]", 400, "object"),
    ("POST", "/v2/sandboxes", {"templateID": 5}, 400, "'templateID'"),
    ("POST", "/v2/sandboxes", {"timeout": 30}, 400, "'templateID'"),
    ("POST", "/v2/sandboxes", {"templateID": "base", "timeout": "300"}, 400, "'timeout'"),
    ("POST", "/v2/sandboxes", {"templateID": "base", "timeout": 1.5}, 400, "'timeout'"),
    ("POST", "/v2/sandboxes", {"templateID": "base", "metadata": {"k": 1}}, 400, "'metadata.k'"),
    ("POST", "/v2/sandboxes", {"templateID": "base", "autoPause": "yes"}, 400, "'autoPause'"),
    ("POST", "/v2/sandboxes", {"templateID": "base", "bogus": 1}, 400, "unknown field 'bogus'"),
    (
        "POST",
        "/v2/sandboxes",
        {"templateID": "base", "network": {"allowOut": ["x"], "nope": 1}},
        400,
        "'network.nope'",
    ),
    ("POST", "/v2/sandboxes", {"templateID": "base", "secure": True}, 400, "'secure'"),  # v1 only
    ("POST", "/v2/sandboxes", {"templateID": "base", "timeout": 0}, 400, "positive"),
    ("POST", "/v2/sandboxes", {"templateID": "base", "timeout": -5}, 400, "positive"),
    ("POST", "/v2/sandboxes", {"templateID": "base", "timeout": 10**9}, 400, "cannot be greater"),
    (
        "POST",
        "/v2/sandboxes",
        {"templateID": "base", "metadata": {"k": "v" * 70000}},
        400,
        "sandbox_metadata_max_value_bytes",
    ),
    ("POST", "/v2/sandboxes", {"templateID": "no-such-template"}, 404, "does not exist"),
    ("POST", "/v2/sandboxes", {"templateID": "../etc"}, 400, "not valid"),
    ("POST", "/v2/sandboxes", {"templateID": "base", "envVars": {"1BAD": "x"}}, 400, "1BAD"),
    (
        "POST",
        "/v2/sandboxes",
        {"templateID": "base", "autoResume": {"enabled": True}},
        400,
        "autoPause",
    ),
    ("POST", "/v2/sandboxes", {"templateID": "base", "mcp": {"x": 5}}, 400, "mcp"),
    (
        "POST",
        "/v2/sandboxes",
        {"templateID": "base", "volumeMounts": [{"name": "ghost", "path": "/mnt"}]},
        400,
        "ghost",
    ),
    ("GET", f"/sandboxes/{GHOST}", None, 404, GHOST),
    ("DELETE", f"/sandboxes/{GHOST}", None, 404, GHOST),
    ("POST", f"/sandboxes/{GHOST}/pause", {}, 404, GHOST),
    ("POST", f"/sandboxes/{GHOST}/timeout", {"timeout": 30}, 404, GHOST),
    ("POST", f"/v2/sandboxes/{GHOST}/connect", {"timeout": 30}, 404, GHOST),
    ("POST", f"/sandboxes/{GHOST}/resume", {}, 404, GHOST),
    ("GET", f"/sandboxes/{GHOST}/metrics", None, 404, GHOST),
    ("GET", "/sandboxes/../../etc/passwd", None, 404, "no such endpoint"),
    ("POST", f"/sandboxes/{GHOST}/timeout", {"timeout": "soon"}, 400, "'timeout'"),
    ("GET", "/v2/sandboxes?state=sleeping", None, 400, "sleeping"),
    ("GET", "/v2/sandboxes?limit=0", None, 400, "limit"),
    ("GET", "/v2/sandboxes?limit=101", None, 400, "limit"),
    ("GET", "/v2/sandboxes?limit=ten", None, 400, "limit"),
    ("GET", "/v2/sandboxes?order=sideways", None, 400, "sideways"),
    ("GET", "/v2/sandboxes?nextToken=%%%", None, 400, "nextToken"),
    ("GET", "/v2/sandboxes?startedAfter=yesterday", None, 400, "startedAfter"),
    ("GET", "/v2/sandboxes?metadata=novalue", None, 400, "metadata"),
    ("GET", "/nowhere", None, 404, "no such endpoint"),
    ("PATCH", "/v2/sandboxes", {}, 405, "not allowed"),
    ("POST", f"/sandboxes/{GHOST}/snapshots", {}, 404, "doesn't exist"),
    ("POST", "/volumes", {"name": "../up"}, 400, "not valid"),
    ("POST", "/volumes", {"name": 3}, 400, "'name'"),
    ("GET", "/volumes/nope", None, 404, "nope"),
    ("DELETE", "/volumes/nope", None, 404, "nope"),
]


def snapshot(server: Server, api: httpx.Client) -> tuple[list[str], list[str], list[str]]:
    ids = sorted(s["sandboxID"] for s in api.get("/v2/sandboxes").json())
    dirs = sorted(p.name for p in (server.data_dir / "sandboxes").iterdir())
    vols = sorted(v["name"] for v in api.get("/volumes").json())
    return ids, dirs, vols


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[httpx.Client]:
    with server.api() as c:
        yield c


@pytest.mark.parametrize(("method", "path", "body", "status", "fragment"), CASES)
def test_rejected_and_nothing_changed(
    server: Server, client: httpx.Client, method: str, path: str, body: object, status: int,
    fragment: str,
) -> None:  # fmt: skip
    before = snapshot(server, client)
    if isinstance(body, bytes):
        r = client.request(method, path, content=body,
                           headers={"Content-Type": "application/json"})  # fmt: skip
    else:
        r = client.request(method, path, json=body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()
    assert err["code"] == status and fragment in err["message"], err
    assert snapshot(server, client) == before


def test_body_size_is_capped(server: Server, client: httpx.Client) -> None:
    r = client.post("/v2/sandboxes", content=b'{"templateID":"' + b"x" * (5 << 20) + b'"}')
    assert r.status_code == 413 and r.json()["code"] == 413


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/v3/templates"), ("POST", "/v2/templates/{build}"),
    ("POST", "/templates/tags"), ("PATCH", "/v2/templates/t0"),
    ("POST", "/secrets"), ("POST", "/secrets/s0"),
])  # fmt: skip
def test_template_and_secret_bodies_are_capped_before_they_are_read(
    server: Server, client: httpx.Client, method: str, path: str, chunked: bool
) -> None:
    """``server_max_body_bytes`` (4 MiB here) bounds every control-plane body: a 1 GiB body is
    refused with 413 after at most the limit was read, not read whole first."""
    if "{build}" in path:  # (a build waiting to start: its start reads the body)
        job = client.post("/v3/templates", json={"name": "capped"}).json()
        path = path.format(build=f"{job['templateID']}/builds/{job['buildID']}")
    headers = {"X-API-KEY": KEY_A, "Content-Type": "application/json"}
    answer = announced(server.port, method, path, 1 << 30, headers, chunked)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"server_max_body_bytes" in answer


def test_api_key_is_required_and_checked(server: Server) -> None:
    for headers in ({}, {"X-API-KEY": "wrong"}):
        r = httpx.get(f"{server.url}/v2/sandboxes", headers=headers)
        assert r.status_code == 401 and r.json()["code"] == 401
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="not-a-key")
    with pytest.raises(AuthenticationException):
        Sandbox.list(SandboxQuery(), api_key="not-a-key").next_items()


def test_data_plane_errors(server: Server, sbx: Sandbox) -> None:
    token = sbx._envd_access_token or ""
    with httpx.Client(base_url=server.url) as c:
        r = c.get("/health", headers={"E2b-Sandbox-Id": GHOST})
        assert r.status_code == 502
        assert r.json() == {"sandboxId": GHOST, "message": "The sandbox was not found", "code": 502}
        r = c.get("/health", headers={"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "x"})
        assert r.status_code == 400
        # A port nothing listens on inside the sandbox.
        r = c.get("/", headers={"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "5999",
                                "X-Access-Token": token})  # fmt: skip
        assert r.status_code == 502 and "port is not open" in r.json()["message"]
        # Other ports need the traffic token (the server default is private).
        r = c.get("/", headers={"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "5999"})
        assert r.status_code == 403
        r = c.get("/files", params={"path": "/etc/hostname", "signature": "v1_forged"})
        assert r.status_code == 401
    assert sbx.is_running()


def test_the_agents_host_routes_are_not_on_the_data_plane(server: Server, sbx: Sandbox) -> None:
    """A checkpoint's quiesce makes the agent let go of its socket: only the host may ask."""
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983",
               "X-Access-Token": sbx._envd_access_token or ""}  # fmt: skip
    with httpx.Client(base_url=server.url) as c:
        r = c.post("/sandhold/quiesce", headers=headers)
        assert r.status_code == 403, r.text
    assert sbx.commands.run("echo still here").stdout == "still here\n"
