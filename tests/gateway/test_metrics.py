"""``GET /metrics`` of ``sandhold gateway serve`` (gateway/prom.py): a real Prometheus server
(Debian's ``prometheus``, on loopback) scrapes a live gateway with the metrics-only bearer token
while tool calls run through its REST API (a create, a pause noticed, a resume, a reclaim, file
views allowed and denied, a caller's error), and its HTTP API is asked what it scraped. No
timing is asserted, only counts, labels and that histograms were observed."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2b.test_metrics import PROMETHEUS, Prometheus
from tests.support.gateway_server import ADMIN_KEY, TENANT_KEY, Gateway, wait_for

TOKEN = "gateway-test-metrics-token"
SCENARIO = "[bold red]x[/] scenario-label-metrics"
# Every label a sandhold_gateway_* series may carry (le: histogram buckets): bounded sets.
LABELS = {"tool", "tenant", "outcome", "event", "operation", "decision", "access", "state", "le"}


def _sandbox(c: httpx.Client, session: str) -> dict | None:
    return c.get(f"/v1/sessions/{session}").json()["sandbox"]


def _call(c: httpx.Client, session: str, tool: str, status: int = 200, **args: object) -> dict:
    r = c.post(f"/v1/sessions/{session}/tools/{tool}", json=args,
               headers={"X-Sandhold-Scenario": SCENARIO})  # fmt: skip
    assert r.status_code == status, r.text
    return dict(r.json())


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed: scripts/install.sh")
def test_prometheus_scrapes_a_live_gateway(
    make_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    gw = make_gateway(gateway_metrics_token=TOKEN)
    prom = Prometheus(tmp_path, f"127.0.0.1:{gw.port}", TOKEN)
    prom.start()
    try:
        prom.wait('up{job="sandhold"}', lambda v: v == 1, "the target never came up")
        s = "metrics-conv-1"
        with gw.client() as c:
            for _ in range(3):
                assert _call(c, s, "run_command", command="true")["exit_code"] == 0
            _call(c, s, "write_file", path="notes.txt", content="hi")  # write allowed
            _call(c, s, "read_file", 403, path="/etc/passwd")  # read denied: caller_error
            _call(c, s, "read_file", 400, path="missing.txt")  # allowed, missing: caller_error
            _call(c, s, "run_command", 400, command="true", bogus=1)  # invalid: caller_error
            sandbox_id = (_sandbox(c, s) or {})["id"]
            # idle: the provider pauses it; the next call resumes it
            wait_for(lambda: (_sandbox(c, s) or {}).get("state") == "paused")
            _call(c, s, "run_command", command="true")
            # paused past the retention: the reclaimer kills it
            wait_for(lambda: _sandbox(c, s) is None)

        def calls(tool: str, outcome: str) -> str:
            return (f'sandhold_gateway_tool_calls_total{{tool="{tool}",tenant="acme",'
                    f'outcome="{outcome}"}}')  # fmt: skip

        prom.wait(calls("run_command", "ok"), lambda v: v == 4, "run_command ok")
        prom.wait(calls("run_command", "caller_error"), lambda v: v == 1, "invalid arguments")
        prom.wait(calls("read_file", "caller_error"), lambda v: v == 2, "read_file errors")
        prom.wait(calls("write_file", "ok"), lambda v: v == 1, "write_file ok")
        assert prom.value(calls("run_command", "server_error")) in (None, 0)
        count = 'sandhold_gateway_tool_call_duration_seconds_count{tool="run_command"}'
        prom.wait(count, lambda v: v == 5, "run_command latencies")
        median = ('histogram_quantile(0.5, sum by (le) '
                  '(sandhold_gateway_tool_call_duration_seconds_bucket))')  # fmt: skip
        assert (prom.value(median) or 0) > 0

        def views(access: str, decision: str) -> str:
            labels = f'access="{access}",decision="{decision}"'
            return f"sandhold_gateway_view_decisions_total{{{labels}}}"

        # run_command's cwd (4 that ran) and read_file's paths; the invalid call never got there
        prom.wait(views("read", "allowed"), lambda v: v == 5, "reads allowed")
        prom.wait(views("read", "denied"), lambda v: v == 1, "the read denied")
        prom.wait(views("write", "allowed"), lambda v: v == 1, "the write allowed")

        def events(name: str) -> str:
            return f'sandhold_gateway_sandbox_events_total{{event="{name}"}}'

        prom.wait(events("created"), lambda v: v == 1, "the create")
        prom.wait(events("resumed"), lambda v: v == 1, "the resume")
        prom.wait(events("reclaimed"), lambda v: v == 1, "the reclaim")
        prom.wait(events("paused"), lambda v: v == 2, "both pauses noticed")
        ops = "sandhold_gateway_sandbox_operation_duration_seconds_count"
        prom.wait(f'{ops}{{operation="create"}}', lambda v: v == 1, "create latency")
        prom.wait(f'{ops}{{operation="resume"}}', lambda v: v == 1, "resume latency")
        decided = 'sandhold_gateway_reclaim_decisions_total{decision="reclaimed"}'
        prom.wait(decided, lambda v: v == 1, "the reclaim decision")
        passes = "sandhold_gateway_reclaim_pass_duration_seconds_count"
        prom.wait(passes, lambda v: v is not None and v >= 1, "reclaim passes")
        assert prom.value('sandhold_gateway_reclaim_decisions_total{decision="error"}') == 0

        # Gauges from the store: the session is open, its sandbox is gone.
        prom.wait('sandhold_gateway_sessions{tenant="acme",state="open"}', lambda v: v == 1,
                  "one open session")  # fmt: skip
        prom.wait('sum(sandhold_gateway_sessions_with_sandbox{tenant="acme"})',
                  lambda v: v is None or v == 0, "no sandbox left")  # fmt: skip
        prom.wait("sandhold_gateway_store_statements_total", lambda v: bool(v), "statements")
        opened = 'sandhold_gateway_store_call_duration_seconds_count{operation="open_and_lock"}'
        prom.wait(opened, lambda v: v is not None and v >= 5, "store calls")

        # Bounded labels: no session, sandbox, path or scenario in any series.
        secret = {s, sandbox_id, SCENARIO, "/etc/passwd", "notes.txt"}
        series = prom.query('{__name__=~"sandhold_gateway_.+"}')
        assert series
        for one in series:
            labels = {k: v for k, v in one["metric"].items()
                      if k not in ("__name__", "job", "instance")}  # fmt: skip
            assert set(labels) <= LABELS, one["metric"]
            assert not secret & set(labels.values()), one["metric"]
            assert not any(s in v or "scenario" in v for v in labels.values()), one["metric"]
    finally:
        prom.stop()


def test_who_may_read_the_metrics(make_gateway: Callable[..., Gateway]) -> None:
    gw = make_gateway(gateway_metrics_token=TOKEN)
    with httpx.Client(base_url=gw.url, timeout=60) as c:
        assert c.get("/metrics").status_code == 401
        for key in ("nope", TENANT_KEY):
            r = c.get("/metrics", headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 401 and r.json()["code"] == "unauthorized", r.text
        # The metrics token reads /metrics only: not the tenant or the admin API.
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert c.get("/v1/sessions", headers=bearer).status_code == 401
        assert c.get("/v1/admin/tenants/acme", headers=bearer).status_code == 401
        r = c.get("/metrics", headers=bearer)
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
        admin = c.get("/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        assert admin.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    assert {
        "sandhold_gateway_tool_calls", "sandhold_gateway_tool_call_duration_seconds",
        "sandhold_gateway_sandbox_events", "sandhold_gateway_sandbox_operation_duration_seconds",
        "sandhold_gateway_reclaim_decisions", "sandhold_gateway_reclaim_pass_duration_seconds",
        "sandhold_gateway_reclaim_pass_failures", "sandhold_gateway_view_decisions",
        "sandhold_gateway_store_call_duration_seconds", "sandhold_gateway_store_statements",
        "sandhold_gateway_sessions", "sandhold_gateway_sessions_with_sandbox",
    } <= set(families), sorted(families)  # fmt: skip
    assert families["sandhold_gateway_tool_call_duration_seconds"].type == "histogram"
    assert families["sandhold_gateway_tool_calls"].type == "counter"
    for f in families.values():
        assert f.name.startswith("sandhold_gateway_") and f.documentation, f
        for sample in f.samples:
            assert set(sample.labels) <= LABELS, sample


def test_metrics_off(make_gateway: Callable[..., Gateway]) -> None:
    gw = make_gateway(gateway_metrics="false")
    with gw.admin() as c:
        r = c.get("/metrics")
        assert r.status_code == 404 and "gateway_metrics=false" in r.json()["message"], r.text
        r = c.post("/v1/sessions/off-1/tools/run_command", json={"command": "true"},
                   headers={"Authorization": f"Bearer {TENANT_KEY}"})  # fmt: skip
        assert r.status_code == 200, r.text
    assert json.loads(r.text)["exit_code"] == 0
