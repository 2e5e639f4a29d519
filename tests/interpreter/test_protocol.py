"""The port-49999 wire format itself (what the SDK hides), over the same route the SDK uses."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from e2b_code_interpreter import Sandbox

from tests.support.interpreter import InterpreterServer


@pytest.fixture
def http(sbx: Sandbox, interp: InterpreterServer) -> Iterator[httpx.Client]:
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49999"}
    if sbx.traffic_access_token:
        headers["E2B-Traffic-Access-Token"] = sbx.traffic_access_token
    with httpx.Client(base_url=interp.sandbox_url, headers=headers, timeout=60) as client:
        yield client


def lines(response: httpx.Response) -> list[dict]:  # type: ignore[type-arg]
    out = [json.loads(ln) for ln in response.text.split("\n") if ln]
    assert response.text.endswith("\n")
    return out


def test_health(http: httpx.Client) -> None:
    r = http.get("/health")
    assert r.status_code == 200 and r.json() == "OK"


def test_execute_stream_shape_and_keepalive(http: httpx.Client) -> None:
    r = http.post(
        "/execute",
        json={"code": "import time\ntime.sleep(6)\nprint('x')\n7", "context_id": None,
              "language": None, "env_vars": None},
    )  # fmt: skip
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/x-ndjson")
    events = lines(r)
    types = [e["type"] for e in events]
    assert types[0] == "number_of_executions"
    assert "keepalive" in types  # idle for more than 5 s
    assert types[-1] == "end_of_execution"
    stdout = next(e for e in events if e["type"] == "stdout")
    assert stdout["text"] == "x\n" and "T" in stdout["timestamp"]
    result = next(e for e in events if e["type"] == "result")
    assert result == {"type": "result", "text": "7", "is_main_result": True}


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"code": "1", "context_id": "x", "language": "python"}, 400),
        ({"code": "1", "language": "cobol"}, 400),
        ({"code": 5}, 400),
        ({"code": "1", "env_vars": {"BAD-NAME": "x"}}, 400),
        ({"code": "1", "context_id": "no-such-context"}, 404),
    ],
)
def test_execute_rejects_bad_requests(http: httpx.Client, body: dict, status: int) -> None:  # type: ignore[type-arg]
    r = http.post("/execute", json=body)
    assert r.status_code == status
    assert set(r.json()) == {"code", "message"} and r.json()["code"] == status


def test_execute_rejects_malformed_json(http: httpx.Client) -> None:
    r = http.post("/execute", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400


def test_language_aliases(http: httpx.Client) -> None:
    r = http.post("/execute", json={"code": "40 + 2", "language": "JS"})
    assert any(e.get("text") == "42" for e in lines(r))


def test_contexts_endpoints(http: httpx.Client) -> None:
    created = http.post("/contexts", json={"language": "bash", "cwd": "/tmp"})
    assert created.status_code == 200
    ctx = created.json()
    assert set(ctx) == {"id", "language", "cwd"} and ctx["cwd"] == "/tmp"
    assert ctx in http.get("/contexts").json()
    assert http.post(f"/contexts/{ctx['id']}/restart").status_code == 204
    assert http.delete(f"/contexts/{ctx['id']}").status_code == 204
    assert http.delete(f"/contexts/{ctx['id']}").status_code == 404
    assert http.post(f"/contexts/{ctx['id']}/restart").status_code == 404
