"""``GET /metrics`` of ``sandhold serve`` (service/prom.py): a real Prometheus server (Debian's
``prometheus``, on loopback) scrapes a live server with the metrics-only bearer token while the
official e2b SDK creates, pauses, resumes and kills sandboxes, and its HTTP API is asked what it
scraped; the text itself is parsed with prometheus_client's parser; the egress tail is fed a log
of its own. No timing is asserted, only counts, labels and that histograms were observed."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import Sandbox
from prometheus_client.parser import text_string_to_metric_families

from sandhold.gateway.providers.e2b import SUSPEND_GAUGE
from sandhold.service.prom import EgressTail
from tests.support.e2b_server import KEY_A, Server, new_server
from tests.support.http import answers

PROMETHEUS = shutil.which("prometheus")
TOKEN = "sandhold-test-metrics-token"
# Every label a sandhold_* series may carry (le: histogram buckets): bounded sets, never ids.
LABELS = {"state", "template", "team", "start", "operation", "mode", "reason", "kind",
          "decision", "le"}  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """A Prometheus server on loopback scraping ``target`` every second."""

    def __init__(self, root: Path, target: str, token: str) -> None:
        self.root = root
        (root / "prometheus.yml").write_text(json.dumps({  # YAML is a superset of JSON
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [{
                "job_name": "sandhold",
                "authorization": {"type": "Bearer", "credentials": token},
                "static_configs": [{"targets": [target]}],
            }],
        }))  # fmt: skip
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert PROMETHEUS is not None
        for _ in range(5):  # the free port may be taken before Prometheus binds it
            self.port = _free_port()
            log = open(self.root / "prometheus.log", "ab")  # noqa: SIM115 (the process's)
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={self.root / 'prometheus.yml'}",
                 f"--storage.tsdb.path={self.root / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
            log.close()
            if answers(f"{self.url}/-/ready", 30, lambda p=self.proc: p.poll() is None):
                return
            self.stop()
        raise RuntimeError(f"prometheus did not start: {self.log()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def log(self) -> str:
        return (self.root / "prometheus.log").read_text(errors="replace")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def query(self, expr: str) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success", body
        return list(body["data"]["result"])

    def value(self, expr: str) -> float | None:
        """The value of an expression of one series (None: no series)."""
        result = self.query(expr)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None

    def wait(self, expr: str, ok: Callable[[float | None], bool], what: str) -> None:
        deadline = time.monotonic() + 60
        value = self.value(expr)
        while not ok(value):
            assert time.monotonic() < deadline, f"{what}: {expr} = {value}\n{self.log()[-2000:]}"
            time.sleep(0.25)
            value = self.value(expr)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Prometheus]]:
    if PROMETHEUS is None:
        pytest.skip("prometheus is not installed: run scripts/install.sh")
    tmp = tmp_path_factory.mktemp("metrics")
    srv = new_server(tmp, server_metrics_token=TOKEN)
    srv.start()
    prom = Prometheus(tmp, f"127.0.0.1:{srv.port}", TOKEN)
    try:
        prom.start()
        yield srv, prom
    finally:
        prom.stop()
        srv.destroy()


def test_prometheus_scrapes_a_live_server(served: tuple[Server, Prometheus]) -> None:
    srv, prom = served
    opts: dict[str, Any] = {"api_url": srv.url, "sandbox_url": srv.url, "api_key": KEY_A}
    prom.wait('up{job="sandhold"}', lambda v: v == 1, "the target never came up")
    created = 'sum(sandhold_create_duration_seconds_count{start="cold"})'
    before = prom.value(created) or 0
    session = "session-metrics-test"
    a = Sandbox.create(timeout=300, metadata={"session_id": session}, **opts)
    b = Sandbox.create(timeout=300, metadata={"session_id": session}, **opts)
    try:
        assert a.commands.run("echo hi").stdout == "hi\n"
        b.pause()
        prom.wait(created, lambda v: v == before + 2, "the creates were not counted")
        base = '{team="team-a",template="base"}'
        prom.wait(f'sandhold_sandboxes{{state="running",{base[1:]}', lambda v: v == 1,
                  "one sandbox runs")  # fmt: skip
        prom.wait(f'sandhold_sandboxes{{state="paused",{base[1:]}', lambda v: v == 1,
                  "one sandbox is paused")  # fmt: skip
        pauses = 'sandhold_lifecycle_duration_seconds_count{operation="pause",mode="memory"}'
        prom.wait(pauses, lambda v: v is not None and v >= 1, "the pause was not observed")
        Sandbox.connect(b.sandbox_id, **opts)
        resumes = 'sandhold_lifecycle_duration_seconds_count{operation="resume",mode="memory"}'
        prom.wait(resumes, lambda v: v is not None and v >= 1, "the resume was not observed")
        # The histogram has observations in its buckets: a median is computed from them.
        median = "histogram_quantile(0.5, sum by (le) (sandhold_create_duration_seconds_bucket))"
        assert (prom.value(median) or 0) > 0
        prom.wait("sandhold_data_disk_total_bytes", lambda v: bool(v), "disk size")
        prom.wait("sandhold_sandbox_disk_budget_bytes", lambda v: bool(v), "disk budgets")
        assert prom.value("sandhold_suspend_to_disk") in (0, 1)

        # Bounded labels: no series carries a sandbox id, a session or any other label.
        ids = {a.sandbox_id, b.sandbox_id, session}
        series = prom.query('{__name__=~"sandhold_.+"}')
        assert series
        for s in series:
            labels = {k: v for k, v in s["metric"].items()
                      if k not in ("__name__", "job", "instance")}  # fmt: skip
            assert set(labels) <= LABELS, s["metric"]
            assert not ids & set(labels.values()), s["metric"]
    finally:
        a.kill()
        b.kill()
    kills = 'sum(sandhold_lifecycle_duration_seconds_count{operation="kill"})'
    prom.wait(kills, lambda v: v is not None and v >= 2, "the kills were not observed")
    prom.wait('sum(sandhold_sandboxes{team="team-a"})', lambda v: v is None, "none is left")
    # The failures counter is there, at 0 for each reason.
    assert prom.value('sum(sandhold_sandboxes_failed_total{reason="oom"})') == 0


def test_the_text_parses_and_who_may_read_it(served: tuple[Server, Prometheus]) -> None:
    srv, _ = served
    with httpx.Client(base_url=srv.url) as c:
        assert c.get("/metrics").status_code == 401
        assert c.get("/metrics", headers={"Authorization": "Bearer nope"}).status_code == 401
        assert c.get("/metrics", headers={"Authorization": f"Bearer {KEY_A}"}).status_code == 401
        # The metrics token reads /metrics only, not the API.
        bearer = {"Authorization": f"Bearer {TOKEN}", "X-API-KEY": TOKEN}
        assert c.get("/sandboxes", headers=bearer).status_code == 401
        r = c.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert c.get("/metrics", headers={"X-API-KEY": KEY_A}).text.count("# TYPE") > 10
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    assert {
        "sandhold_sandboxes", "sandhold_create_duration_seconds",
        "sandhold_lifecycle_duration_seconds", "sandhold_sandboxes_failed",
        "sandhold_oom_kills", "sandhold_egress_decisions", "sandhold_suspend_to_disk",
        "sandhold_data_disk_used_bytes", "sandhold_data_disk_total_bytes",
        "sandhold_sandbox_disk_budget_bytes", "sandhold_pool_hits", "sandhold_pool_misses",
        "sandhold_pool_ready", "sandhold_pool_size",
    } <= set(families)  # fmt: skip
    assert families["sandhold_create_duration_seconds"].type == "histogram"
    assert families["sandhold_sandboxes_failed"].type == "counter"
    for f in families.values():
        assert f.name.startswith("sandhold_") and f.documentation, f
        for sample in f.samples:
            assert set(sample.labels) <= LABELS, sample
    # What the gateway's e2b provider reads (whole numbers, as the hand-written text had).
    assert SUSPEND_GAUGE.search(r.text) is not None


def test_metrics_off_serves_only_the_suspend_gauge(tmp_path: Path) -> None:
    srv = new_server(tmp_path, server_metrics="false")
    srv.start()
    try:
        with srv.api() as api:
            text = api.get("/metrics").text
        names = {f.name for f in text_string_to_metric_families(text)}
        assert names == {"sandhold_suspend_to_disk"}, text
        assert SUSPEND_GAUGE.search(text) is not None
    finally:
        srv.destroy()


def test_egress_decisions_are_counted_from_the_audit_log(tmp_path: Path) -> None:
    def write(day: str, text: str) -> None:
        with open(tmp_path / f"{day}.jsonl", "a") as f:
            f.write(text)

    def line(kind: str, decision: str) -> str:
        return json.dumps({"kind": kind, "decision": decision}) + "\n"

    write("2030-01-01", line("http", "allow"))  # before the server started: not counted
    tail = EgressTail(tmp_path)
    tail.poll()
    assert sum(tail.counts.values()) == 0
    write("2030-01-01", line("http", "deny") + line("dns", "allow"))
    write("2030-01-01", line("connect", "allow")[:20])  # half written: read when whole
    tail.poll()
    assert tail.counts == {("http", "deny"): 1, ("dns", "allow"): 1}
    write("2030-01-01", line("connect", "allow")[20:] + "not json\n")
    write("2030-01-02", line("ssh", "maybe") + line("mitm", "deny"))  # the next UTC day
    tail.poll()
    tail.poll()  # nothing new: nothing counted twice
    assert tail.counts == {("http", "deny"): 1, ("dns", "allow"): 1, ("connect", "allow"): 1,
                           ("other", "other"): 1, ("mitm", "deny"): 1}  # fmt: skip
