"""The edge's Prometheus metrics (``GET /metrics`` of `sandhold edge serve`, docs/fleet.md):
what this edge did (placements, refusals, creates no host could take, sandboxes taken up on a
new host, hosts it judged lost) and, computed at each scrape from its last poll, every host's
capacity and use. ``sandhold_fleet_free_slots`` is what a node autoscaler (KEDA) can scale a
placeholder Deployment on: a DaemonSet never asks for nodes itself."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sandhold.fleet.members import Members


class EdgeMetrics:
    def __init__(self, members: Members) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.placements = Counter(
            "sandhold_fleet_placements",
            "Creates this edge placed, by the host that took them.",
            ["host"],
            registry=self.registry,
        )
        self.refusals = Counter(
            "sandhold_fleet_refusals",
            "Creates a host refused before doing anything (full, draining) or did not answer; "
            "the edge then tried the next host.",
            ["host"],
            registry=self.registry,
        )
        self.unplaced = Counter(
            "sandhold_fleet_unplaced",
            "Creates no host could take (answered 503).",
            registry=self.registry,
        )
        self.migrations = Counter(
            "sandhold_fleet_migrations",
            "Sandboxes in the shared store only (their host drained or was lost) taken up by a "
            "host, by that host.",
            ["host"],
            registry=self.registry,
        )
        self.registry.register(_Hosts(members))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _Hosts(Collector):
    def __init__(self, members: Members) -> None:
        self.members = members

    def collect(self) -> Iterable[Metric]:
        capacity = GaugeMetricFamily(
            "sandhold_fleet_host_capacity", "Sandboxes a host holds at once.", labels=["host"]
        )
        used = GaugeMetricFamily(
            "sandhold_fleet_host_used",
            "Sandboxes that hold memory on a host (running, paused in memory).",
            labels=["host"],
        )
        draining = GaugeMetricFamily(
            "sandhold_fleet_host_draining", "1 while a host drains.", labels=["host"]
        )
        unstored = GaugeMetricFamily(
            "sandhold_fleet_host_unstored_paused",
            "Paused sandboxes of a host not yet in the shared store: they die with the host.",
            labels=["host"],
        )
        free = 0
        for host_id, info in sorted(self.members.live.items()):
            cap, use = int(info["capacity"]), int(info["used"])
            capacity.add_metric([host_id], cap)
            used.add_metric([host_id], use)
            draining.add_metric([host_id], 1 if info.get("draining") else 0)
            unstored.add_metric([host_id], int(info.get("unstored", 0)))
            if not info.get("draining"):
                free += max(0, cap - use)
        yield from (capacity, used, draining, unstored)
        hosts = GaugeMetricFamily(
            "sandhold_fleet_hosts_answering", "Hosts that answered this edge's last poll."
        )
        hosts.add_metric([], len(self.members.live))
        yield hosts
        slots = GaugeMetricFamily(
            "sandhold_fleet_free_slots", "Free capacity over the hosts that take creates."
        )
        slots.add_metric([], free)
        yield slots
        lost = CounterMetricFamily(
            "sandhold_fleet_lost_hosts", "Hosts this edge judged lost (silent past the deadline)."
        )
        lost.add_metric([], self.members.lost)
        yield lost
