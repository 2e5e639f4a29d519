"""Prometheus metrics of ``sandhold gateway serve`` (``GET /metrics``), with the official client.

Each gateway has a registry of its own (never the library's global one: tests run several
gateways in one process). The counting is done by subclasses of the gateway's parts, built
instead of them when ``gateway_metrics`` is on (``GatewayMetrics.manager`` and the others), so
the parts themselves carry no metrics code:

- ``MeteredTools.call``: every tool call (REST and MCP) by tool, tenant and outcome (``ok``;
  ``caller_error``: the caller's fault, a 4xx; ``server_error``: ours or the provider's, a 5xx
  or an unexpected exception), and its latency by tool; a call cancelled (the client went away)
  is not counted;
- ``MeteredTimeline``: the events the gateway records: sandbox creates, adoptions, resumes,
  replacements, network updates, orphan kills and the pauses and failures it notices (creates
  and resumes with their latency, as the timeline's ``duration_ms``), and the file-view decision
  of each file tool call (its ``reason``);
- ``MeteredReclaimer.run_pass``: the decisions of each reclaim pass (its ``PassReport``) and the
  pass's duration;
- ``MeteredManager.db``: store transactions by operation (the ``Store`` method) and their
  duration; an SQLAlchemy event counts every SQL statement (round trips, the timeline's and the
  key lookups' included);
- at scrape: sessions by tenant and state, and open sessions that have a sandbox, by tenant (one
  ``COUNT ... GROUP BY`` query each).

Labels are bounded: ``tool``, ``outcome``, ``event``, ``decision``, ``access``, ``operation``
and ``state`` by fixed sets (the code's), ``tenant`` by the operator's configuration; never a
session, a sandbox, a path or a scenario (the platform's, unbounded). docs/console.md lists them.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector
from sqlalchemy import event

from sandhold.config import Settings
from sandhold.errors import NotFound, SandholdError, Unauthenticated
from sandhold.gateway.deliverables import DeliverableStore
from sandhold.gateway.errors import server_fault
from sandhold.gateway.lifecycle import PassReport, Reclaimer
from sandhold.gateway.policy import TenantPolicy
from sandhold.gateway.providers.base import Provider
from sandhold.gateway.sessions import SandboxSessionManager
from sandhold.gateway.timeline import Timeline
from sandhold.gateway.tool_args import MODELS
from sandhold.gateway.tools import Tools
from sandhold.store.db import Store

T = TypeVar("T")
disable_created_metrics()  # no *_created samples (the process's start time, per series)

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)
SANDBOX_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
OUTCOMES = ("ok", "caller_error", "server_error")
# Timeline kinds counted in sandhold_gateway_sandbox_events_total (event: the kind's suffix).
SANDBOX_EVENTS = (
    "created",
    "adopted",
    "resumed",
    "paused",
    "failed",
    "replaced",
    "network_updated",
    "orphan_killed",
    "reclaimed",
)
TIMED = {
    "sandbox_created": "create",
    "sandbox_resumed": "resume",
    "sandbox_network_updated": "network_update",
}
# PassReport fields counted as reclaim decisions.
DECISIONS = {
    "reclaimed": "reclaimed",
    "skipped_in_use": "skipped_in_use",
    "skipped_locked": "skipped_locked",
    "skipped_changed": "skipped_changed",
    "orphans_killed": "orphan_killed",
    "pauses_recorded": "pause_recorded",
    "failures_recorded": "failure_recorded",
    "errors": "error",
}


class GatewayMetrics:
    """One gateway's registry, and the factories of its metered parts (the plain parts when
    ``gateway_metrics`` is off)."""

    def __init__(self, settings: Settings, store: Store) -> None:
        self.settings = settings
        self.store = store
        self.enabled = settings.gateway_metrics
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.tool_calls = Counter(
            "sandhold_gateway_tool_calls",
            "Tool calls (REST and MCP) by tool, tenant and outcome: ok, caller_error (the "
            "caller's fault: bad arguments, a path outside the view, a quota), server_error (the "
            "gateway's or the provider's).",
            ["tool", "tenant", "outcome"],
            registry=r,
        )
        self.tool_seconds = Histogram(
            "sandhold_gateway_tool_call_duration_seconds",
            "Tool calls from their validation to their result (or error), by tool; a cold "
            "call includes its sandbox's create or resume.",
            ["tool"],
            buckets=CALL_BUCKETS,
            registry=r,
        )
        self.sandbox_events = Counter(
            "sandhold_gateway_sandbox_events",
            "What happened to sessions' sandboxes, as the gateway recorded it: created, "
            "adopted, resumed, replaced, network_updated, orphan_killed, reclaimed; paused and "
            "failed (by the provider, noticed by a call or the reclaimer).",
            ["event"],
            registry=r,
        )
        self.sandbox_seconds = Histogram(
            "sandhold_gateway_sandbox_operation_duration_seconds",
            "Sandbox operations the gateway waited for, by operation: create (workspace and "
            "provider create), resume (the provider's connect of a paused sandbox), "
            "network_update.",
            ["operation"],
            buckets=SANDBOX_BUCKETS,
            registry=r,
        )
        self.reclaim_decisions = Counter(
            "sandhold_gateway_reclaim_decisions",
            "Decisions of the reclaim passes, by decision: reclaimed (paused past retention, "
            "killed), skipped_in_use, skipped_locked (a call was changing the session or the "
            "lease ran short), skipped_changed (resumed or changed meanwhile), orphan_killed, "
            "pause_recorded, failure_recorded, error.",
            ["decision"],
            registry=r,
        )
        self.reclaim_seconds = Histogram(
            "sandhold_gateway_reclaim_pass_duration_seconds",
            "Reclaim passes (this replica's loop and POST /v1/admin/reclaim), whole.",
            buckets=SANDBOX_BUCKETS,
            registry=r,
        )
        self.reclaim_failed = Counter(
            "sandhold_gateway_reclaim_pass_failures",
            "Reclaim passes that ended with an exception (listing the provider failed, ...).",
            registry=r,
        )
        self.view_decisions = Counter(
            "sandhold_gateway_view_decisions",
            "File-view decisions of file tool calls (the path, or run_command's cwd), by "
            "access (read, write) and decision (allowed, denied).",
            ["access", "decision"],
            registry=r,
        )
        self.store_seconds = Histogram(
            "sandhold_gateway_store_call_duration_seconds",
            "Store transactions of the gateway by operation (the store's method), on a worker "
            "thread; timeline writes are add_event.",
            ["operation"],
            buckets=STORE_BUCKETS,
            registry=r,
        )
        self.statements = Counter(
            "sandhold_gateway_store_statements",
            "SQL statements sent to the store (each a round trip), every caller included.",
            registry=r,
        )
        for tool in MODELS:  # every series present from the start, at 0
            self.tool_seconds.labels(tool)
        for name in SANDBOX_EVENTS:
            self.sandbox_events.labels(name)
        for decision in DECISIONS.values():
            self.reclaim_decisions.labels(decision)
        for access in ("read", "write"):
            for decision in ("allowed", "denied"):
                self.view_decisions.labels(access, decision)
        r.register(_Sessions(store))
        if self.enabled:
            event.listen(store.engine, "before_cursor_execute", self._statement)

    def _statement(self, *_: Any) -> None:
        self.statements.inc()

    # -- the parts -------------------------------------------------------------------------------
    def manager(
        self, settings: Settings, store: Store, provider: Provider, timeline: Timeline
    ) -> SandboxSessionManager:
        if not self.enabled:
            return SandboxSessionManager(settings, store, provider, timeline)
        return MeteredManager(settings, store, provider, timeline, metrics=self)

    def timeline(self, store: Store, replica: str) -> Timeline:
        return MeteredTimeline(store, replica, self) if self.enabled else Timeline(store, replica)

    def reclaimer(self, manager: SandboxSessionManager) -> Reclaimer:
        return MeteredReclaimer(manager, self) if self.enabled else Reclaimer(manager)

    def tools(
        self, manager: SandboxSessionManager, deliverables: DeliverableStore, timeline: Timeline
    ) -> Tools:
        if not self.enabled:
            return Tools(manager, deliverables, timeline)
        return MeteredTools(manager, deliverables, timeline, metrics=self)

    # -- observations ----------------------------------------------------------------------------
    def tool_call(self, tool: str, tenant: str, outcome: str, seconds: float) -> None:
        tool = tool if tool in MODELS else "unknown"
        self.tool_calls.labels(tool, tenant, outcome).inc()
        self.tool_seconds.labels(tool).observe(seconds)

    def recorded(self, kind: str, fields: dict[str, Any]) -> None:
        """A timeline event the gateway records (before it is written: best effort)."""
        if kind == "tool_call":
            reason = fields.get("reason") or ""
            if reason.startswith("view: "):
                access = reason.split(" ", 2)[1]
                decision = "allowed" if reason.endswith(" allowed") else "denied"
                if access in ("read", "write"):
                    self.view_decisions.labels(access, decision).inc()
            return
        name = kind.removeprefix("sandbox_")
        if name in SANDBOX_EVENTS and name != kind:
            self.sandbox_events.labels(name).inc()
            ms = fields.get("duration_ms")
            if kind in TIMED and isinstance(ms, int | float):
                self.sandbox_seconds.labels(TIMED[kind]).observe(ms / 1000)

    def reclaim_pass(self, report: PassReport | None, seconds: float) -> None:
        self.reclaim_seconds.observe(seconds)
        if report is None:
            self.reclaim_failed.inc()
            return
        for field, decision in DECISIONS.items():
            n = getattr(report, field)
            if n:
                self.reclaim_decisions.labels(decision).inc(n)
        # The reclaimer writes its pauses, failures and reclaims with set-based queries, not
        # through the timeline: counted here (its orphan kills do go through the timeline).
        for field, name in (
            ("pauses_recorded", "paused"),
            ("failures_recorded", "failed"),
            ("reclaimed", "reclaimed"),
        ):
            if n := getattr(report, field):
                self.sandbox_events.labels(name).inc(n)

    # -- GET /metrics ----------------------------------------------------------------------------
    def authorize(self, key: str | None) -> None:
        """The admin key or ``gateway_metrics_token`` (a metrics-only bearer) may read."""
        if not self.enabled:
            raise NotFound("metrics are off (gateway_metrics=false)")
        for expected in (self.settings.gateway_metrics_token, self.settings.gateway_admin_key):
            if expected and key and hmac.compare_digest(key.encode(), expected.encode()):
                return
        raise Unauthenticated(
            "GET /metrics needs the metrics token or the admin key (Authorization: Bearer ...)"
        )

    async def exposition(self) -> bytes:
        return await asyncio.to_thread(generate_latest, self.registry)  # the gauges query


class _Sessions(Collector):
    """Sessions by tenant and state, and open sessions with a sandbox, by tenant: two COUNTs."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        states, sandboxes = self.store.session_counts()
        g = GaugeMetricFamily(
            "sandhold_gateway_sessions",
            "Sessions in the store by tenant and state (open, closed).",
            labels=["tenant", "state"],
        )
        for tenant, state, n in sorted(states):
            g.add_metric([tenant, state], n)
        yield g
        s = GaugeMetricFamily(
            "sandhold_gateway_sessions_with_sandbox",
            "Open sessions that have a sandbox (running or paused), by tenant.",
            labels=["tenant"],
        )
        for tenant, n in sorted(sandboxes):
            s.add_metric([tenant], n)
        yield s


class MeteredManager(SandboxSessionManager):
    def __init__(self, *args: Any, metrics: GatewayMetrics) -> None:
        super().__init__(*args)
        self.metrics = metrics

    async def db(self, fn: Callable[..., T], *args: Any) -> T:
        if getattr(fn, "__self__", None) is not self.store:
            return await super().db(fn, *args)  # not a store query (a workspace's mkdir, ...)
        t0 = time.perf_counter()
        try:
            return await super().db(fn, *args)
        finally:
            self.metrics.store_seconds.labels(fn.__name__).observe(time.perf_counter() - t0)


class MeteredTimeline(Timeline):
    def __init__(self, store: Store, replica: str, metrics: GatewayMetrics) -> None:
        super().__init__(store, replica)
        self.metrics = metrics

    def row(self, tenant_id: str, session_id: str, kind: str, **fields: Any) -> dict[str, Any]:
        self.metrics.recorded(kind, fields)
        return super().row(tenant_id, session_id, kind, **fields)

    async def record(self, tenant_id: str, session_id: str, kind: str, **fields: Any) -> None:
        self.metrics.recorded(kind, fields)
        t0 = time.perf_counter()
        await super().record(tenant_id, session_id, kind, **fields)
        self.metrics.store_seconds.labels("add_event").observe(time.perf_counter() - t0)


class MeteredReclaimer(Reclaimer):
    def __init__(self, manager: SandboxSessionManager, metrics: GatewayMetrics) -> None:
        super().__init__(manager)
        self.metrics = metrics

    async def run_pass(self) -> PassReport:
        t0 = time.perf_counter()
        report = None
        try:
            report = await super().run_pass()
            return report
        finally:
            self.metrics.reclaim_pass(report, time.perf_counter() - t0)


class MeteredTools(Tools):
    def __init__(self, *args: Any, metrics: GatewayMetrics) -> None:
        super().__init__(*args)
        self.metrics = metrics

    async def call(
        self,
        tenant_id: str,
        tool: str,
        arguments: dict[str, Any],
        session_id: str | None = None,
        policy: TenantPolicy | None = None,
    ) -> dict[str, Any]:
        t0 = time.perf_counter()
        outcome = None  # cancelled (BaseException): not counted
        try:
            result = await super().call(tenant_id, tool, arguments, session_id, policy)
            outcome = "ok"
            return result
        except SandholdError as e:
            outcome = "server_error" if server_fault(e) else "caller_error"
            raise
        except Exception:
            outcome = "server_error"
            raise
        finally:
            if outcome is not None:
                self.metrics.tool_call(tool, tenant_id, outcome, time.perf_counter() - t0)
