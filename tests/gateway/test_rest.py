"""The REST API: tools, files, deliverables, OpenAPI, and bad input (clear error, nothing
changed)."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable

import boto3
import pytest
from moto.server import ThreadedMotoServer

from sandhold.gateway.tool_args import MODELS
from tests.support.gateway_server import OTHER_KEY, Gateway, tool

MAX_PAYLOAD = 1024 * 1024


@pytest.fixture
def gw(make_gateway: Callable[..., Gateway]) -> Gateway:
    return make_gateway("local", gateway_max_payload_bytes=MAX_PAYLOAD)


def test_tools_files_and_local_deliverables(gw: Gateway) -> None:
    blob = bytes(range(256)) * 40
    with gw.client() as c:
        r = tool(c, "files", "upload", path="data/blob.bin",
                 content_base64=base64.b64encode(blob).decode())  # fmt: skip
        assert r == {"path": "/workspace/data/blob.bin", "size": len(blob)}
        r = tool(c, "files", "download", path="/workspace/data/blob.bin")
        assert base64.b64decode(r["content_base64"]) == blob
        listing = tool(c, "files", "list_files", path="data")["entries"]
        assert [(e["name"], e["type"], e["size"]) for e in listing] == [("blob.bin", "file", 10240)]
        r = tool(c, "files", "run_code", code="console.log([1,2,3].map(x => x * 2).join())",
                 language="javascript")  # fmt: skip
        assert r["stdout"] == "2,4,6\n" and r["exit_code"] == 0
        r = tool(c, "files", "run_command", command="echo $FOO; pwd", cwd="data",
                 env={"FOO": "bar"})  # fmt: skip
        assert r["stdout"] == "bar\n/workspace/data\n"
        r = tool(c, "files", "run_command", command="sleep 5", timeout_s=1)
        assert r["exit_code"] is None and "timed out" in r["error"]

        d = tool(c, "files", "publish_deliverable", path="data/blob.bin", name="blob.bin")
        assert d["size"] == len(blob) and d["sha256"] == hashlib.sha256(blob).hexdigest()
        assert d["url"].endswith(f"/v1/deliverables/{d['id']}")
        got = c.get(f"/v1/deliverables/{d['id']}")
        assert got.status_code == 200 and got.content == blob
        # another tenant can see neither the deliverable nor the session
        with gw.client(OTHER_KEY) as other:
            assert other.get(f"/v1/deliverables/{d['id']}").status_code == 404
            assert other.get("/v1/sessions/files").status_code == 404
        stats = c.get("/v1/stats").json()
    calls = {e["tool"]: e for e in stats["events"] if e["kind"] == "tool_call"}
    assert calls["upload"]["bytes_in"] > 0 and calls["download"]["bytes_out"] == len(blob)
    assert stats["sessions"] == 1 and stats["live_sandboxes"] == 1


def test_bad_input_changes_nothing(gw: Gateway) -> None:
    big = "x" * (2 * MAX_PAYLOAD)
    with gw.client() as c:
        cases = [
            ("/v1/sessions/nope", "get", None, 404, "not_found"),
            ("/v1/sessions/nope/timeline", "get", None, 404, "not_found"),
            ("/v1/sessions/nope", "delete", None, 404, "not_found"),
            ("/v1/sessions/s1/tools/run_command", "post", {"cmd": "ls"}, 400, "invalid_argument"),
            ("/v1/sessions/s1/tools/run_command", "post", {"command": 5}, 400, "invalid_argument"),
            ("/v1/sessions/s1/tools/run_command", "post",
             {"command": "ls", "template": "big"}, 400, "invalid_argument"),
            ("/v1/sessions/s1/tools/run_command", "post",
             {"command": "ls", "timeout_s": 10_000}, 400, "invalid_argument"),
            ("/v1/sessions/s1/tools/run_code", "post",
             {"code": "1", "language": "cobol"}, 400, "invalid_argument"),
            ("/v1/sessions/s1/tools/upload", "post",
             {"path": "a", "content_base64": "%%%"}, 400, "invalid_argument"),
            ("/v1/sessions/s1/tools/read_file", "post", {"path": "a\u0000b"}, 400,
             "invalid_argument"),
            ("/v1/sessions/s1/tools/fork_bomb", "post", {}, 404, "not_found"),
            ("/v1/sessions/bad%20id/tools/run_command", "post", {"command": "ls"}, 400,
             "invalid_argument"),
            ("/v1/sessions/s1/tools/write_file", "post", {"path": "a", "content": big}, 413,
             "payload_too_large"),
        ]  # fmt: skip
        for path, method, body, status, code in cases:
            r = c.request(method, path, json=body)
            assert (r.status_code, r.json()["code"]) == (status, code), (path, body, r.text)
            assert r.json()["message"]
        limits = [  # (tool, arguments, the setting the refusal names)
            ("run_command", {"command": "env", "env": {f"V{i}": "x" for i in range(129)}},
             "gateway_command_env_max_vars"),
            ("run_command", {"command": "env", "env": {"BIG": "x" * 70_000}},
             "gateway_command_env_max_bytes"),
            ("run_command", {"command": "ls", "cwd": "/workspace/" + "d" * 5000},
             "gateway_max_path_bytes"),
            ("read_file", {"path": "f" * 5000}, "gateway_max_path_bytes"),
            ("run_command", {"command": "env", "env": {"1BAD": "x"}}, "not a valid variable"),
        ]  # fmt: skip
        for name, args, setting in limits:
            r = c.post(f"/v1/sessions/s1/tools/{name}", json=args)
            assert r.status_code == 400 and r.json()["code"] == "invalid_argument", r.text
            assert setting in r.json()["message"] and len(r.json()["message"]) < 400, r.text
        r = c.post("/v1/sessions/s1/tools/run_command", content=b"{not json")
        assert r.status_code == 400 and "JSON" in r.json()["message"]
        assert c.get("/v1/sessions").json() == []  # no session was opened
        assert c.get("/v1/stats").json()["live_sandboxes"] == 0
    with gw.client("not-a-key") as anon:
        r = anon.post("/v1/sessions/s1/tools/run_command", json={"command": "ls"})
        assert r.status_code == 401 and r.json()["code"] == "unauthorized"
    with gw.client() as c:
        assert c.post("/v1/admin/reclaim").status_code == 401  # tenant key is not admin


def test_openapi_and_admin(gw: Gateway) -> None:
    with gw.client() as c:
        spec = c.get("/openapi.json").json()
    assert spec["openapi"].startswith("3.")
    ops = {op["operationId"] for p in spec["paths"].values() for op in p.values()
           if "operationId" in op}  # fmt: skip
    assert ops == set(MODELS)
    schema = spec["components"]["schemas"]["RunCommand"]
    assert schema["additionalProperties"] is False and "command" in schema["required"]
    with gw.admin() as admin:
        r = admin.put("/v1/admin/tenants/initech", json={"policy": {"keep_alive_s": 0}})
        assert r.status_code == 400
        r = admin.put("/v1/admin/tenants/initech", json={"policy": {"env": {"A=B": "x"}}})
        assert r.status_code == 400 and "not a valid variable name" in r.json()["message"]
        # The sizes of a policy's env are the sandbox service's: judged at the session's create.
        big = {"api_key": "bigenv-key-0123456789",
               "policy": {"env": {f"V{i}": "x" * 1024 for i in range(300)}}}  # fmt: skip
        assert admin.put("/v1/admin/tenants/bigenv", json=big).status_code == 200
        with gw.client("bigenv-key-0123456789") as c:
            r = c.post("/v1/sessions/b1/tools/run_command", json={"command": "true"})
            assert r.status_code == 400 and "sandbox_env_max_bytes" in r.json()["message"], r.text
            assert c.get("/v1/stats").json()["live_sandboxes"] == 0
        body = {"api_key": "initech-key-0123456789", "policy": {"keep_alive_s": 60}}
        r = admin.put("/v1/admin/tenants/initech", json=body)
        assert r.status_code == 200 and r.json()["policy"]["keep_alive_s"] == 60
        assert admin.post("/v1/admin/reclaim").json()["errors"] == 0
    with gw.client("initech-key-0123456789") as c:
        assert tool(c, "i1", "run_command", command="echo ok")["stdout"] == "ok\n"


def test_s3_deliverables(
    make_gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")  # the gateway process inherits these
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()  # binds in this process: no port is released and taken again
    try:
        host, port = moto.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        creds = {"aws_access_key_id": "test", "aws_secret_access_key": "test"}
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **creds)
        s3.create_bucket(Bucket="deliverables")
        gw = make_gateway(
            "local", gateway_deliverables="s3", gateway_s3_bucket="deliverables",
            gateway_s3_endpoint_url=endpoint, gateway_s3_region="us-east-1",
        )  # fmt: skip
        with gw.client() as c:
            tool(c, "s3", "write_file", path="out/report.csv", content="a,b\n1,2\n")
            d = tool(c, "s3", "publish_deliverable", path="out/report.csv")
            assert d["storage"] == "s3" and d["name"] == "report.csv"
            assert c.get(f"/v1/deliverables/{d['id']}").content == b"a,b\n1,2\n"
        key = f"deliverables/acme/s3/{d['id']}-report.csv"
        assert s3.get_object(Bucket="deliverables", Key=key)["Body"].read() == b"a,b\n1,2\n"
        assert d["url"] == f"{endpoint}/deliverables/{key}"
    finally:
        moto.stop()
