"""The gateway's structured log (docs/logs.md): one JSON line per request, with its request id
and the session it served, on disk under the data dir; no key in it."""

from __future__ import annotations

import json
from collections.abc import Callable

from tests.support.gateway_server import TENANT_KEY, Gateway, wait_for


def test_a_tool_call_is_logged_with_its_ids(make_gateway: Callable[..., Gateway]) -> None:
    gw = make_gateway("local")
    with gw.client() as c:
        r = c.post("/v1/sessions/conv-logged/tools/run_command", json={"command": "true"},
                   headers={"X-Request-Id": "req-gw-0001"})  # fmt: skip
    assert r.status_code == 200 and r.headers["x-request-id"] == "req-gw-0001"
    log = gw.data_dir / "logs" / "gateway.jsonl"

    def line() -> dict[str, object] | None:
        if not log.exists():
            return None
        for raw in log.read_text().splitlines():
            rec = json.loads(raw)
            if rec.get("request_id") == "req-gw-0001" and "status" in rec:
                return rec
        return None

    rec = wait_for(line)
    assert rec["session"] == "conv-logged" and rec["status"] == 200, rec
    assert rec["path"] == "/v1/sessions/conv-logged/tools/run_command"
    assert TENANT_KEY not in log.read_text()
