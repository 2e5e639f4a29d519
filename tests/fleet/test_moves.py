"""Sandboxes that outlive their host (docs/fleet.md), with the official SDK through the edge and
a moto S3 server as the shared store: a stored paused sandbox resumes on another host after its
own is killed; a draining host hands every sandbox over and exits 0; a host restarted in place
takes its own back without the store (drained by `sandhold host drain`, a pod's preStop)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from e2b import Sandbox
from e2b.exceptions import ServiceBusyException

from tests.counter import COUNTER
from tests.e2b.test_suspend import state
from tests.fleet.harness import (
    BUCKET,
    TOKEN,
    Edge,
    catalog_url,
    entry,
    host_of,
    new_host,
    running,
    s3_store,
    scrape,
    wait_for,
)
from tests.support.e2b_server import Server, needs_criu


@pytest.fixture(scope="module")
def store() -> Iterator[dict[str, str]]:
    needs_criu()
    with s3_store() as settings:
        yield settings


@pytest.fixture
def fleet(postgres, store, tmp_path: Path) -> Iterator[tuple[list[Server], Edge]]:  # type: ignore[no-untyped-def]
    hosts = [
        new_host(tmp_path, f"m{i}", fleet_store_after_s="0.5", fleet_drain_timeout_s="60", **store)
        for i in (1, 2)
    ]
    edge = Edge(tmp_path, catalog_url(postgres), hosts)
    with running(hosts, [edge]):
        yield hosts, edge


def paused_at_edge(edge: Edge, sandbox_id: str) -> bool:
    try:
        return Sandbox.get_info(sandbox_id, **edge.sdk()).state.value == "paused"
    except ServiceBusyException:  # its host silent, not yet judged
        return False


def start_counter(edge: Edge) -> tuple[Sandbox, int, str]:
    sbx = Sandbox.create(timeout=300, **edge.sdk())
    sbx.commands.run(COUNTER, background=True)
    n0, secret = state(sbx)
    sbx.files.write("/home/user/notes.txt", "kept")
    return sbx, n0, secret


def test_a_stored_sandbox_resumes_on_another_host_after_its_own_is_killed(fleet) -> None:  # type: ignore[no-untyped-def]
    hosts, edge = fleet
    sbx, n0, secret = start_counter(edge)
    first = next(h for h in hosts if host_of(h, sbx.sandbox_id))
    other = next(h for h in hosts if h is not first)
    try:
        sbx.pause()
        wait_for(lambda: (entry(first, sbx.sandbox_id) or {}).get("stored"), 60, "the store")
        assert ("sandhold_fleet_unstored_paused", ()) in (m := scrape(first.url))
        assert m[("sandhold_fleet_unstored_paused", ())] == 0  # its memory is in the store
        first.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        first.proc.wait()  # type: ignore[union-attr]
        first.sock.close()  # (held by the test: connections would wait in its backlog)
        wait_for(lambda: paused_at_edge(edge, sbx.sandbox_id), 30, "the host judged lost")
        resumed = Sandbox.connect(sbx.sandbox_id, timeout=300, **edge.sdk())
        assert host_of(other, sbx.sandbox_id)  # the same id, on the other host
        n1, secret1 = state(resumed)
        assert secret1 == secret and n1 > n0  # the same process, its memory carried over
        assert resumed.files.read("/home/user/notes.txt") == "kept"
    finally:
        sbx.kill()
        first.proc = None  # (the fixture's destroy cleans what the kill left)


def test_a_draining_host_hands_its_sandboxes_over_and_exits(fleet) -> None:  # type: ignore[no-untyped-def]
    hosts, edge = fleet
    sbx, n0, secret = start_counter(edge)
    first = next(h for h in hosts if host_of(h, sbx.sandbox_id))
    other = next(h for h in hosts if h is not first)
    try:
        first.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        assert first.proc.wait(90) == 0  # type: ignore[union-attr]
        first.sock.close()
        assert paused_at_edge(edge, sbx.sandbox_id)  # handed over before the host went
        n1, secret1 = state(sbx)  # its traffic takes it up on the other host, running
        assert host_of(other, sbx.sandbox_id)
        assert secret1 == secret and n1 > n0
        assert sbx.files.read("/home/user/notes.txt") == "kept"
    finally:
        sbx.kill()
        first.proc = None


def test_a_host_restarted_in_place_takes_its_own_back_without_the_store(fleet, store) -> None:  # type: ignore[no-untyped-def]
    hosts, edge = fleet
    sbx, n0, secret = start_counter(edge)
    first = next(h for h in hosts if host_of(h, sbx.sandbox_id))
    try:
        drain = subprocess.run(
            [sys.executable, "-m", "sandhold.cli", "host", "drain", "--url", first.url],
            env={**os.environ, "SANDHOLD_FLEET_TOKEN": TOKEN}, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        assert drain.returncode == 0 and "drained" in drain.stdout, drain.stdout + drain.stderr
        assert first.proc.wait(30) == 0  # type: ignore[union-attr]
        s3 = boto3.client("s3", endpoint_url=store["snapshot_s3_endpoint_url"],
                          region_name="us-east-1")  # fmt: skip
        for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", []):
            s3.delete_object(Bucket=BUCKET, Key=o["Key"])  # the store lost it all
        first.start()  # the same host id and data dir
        wait_for(lambda: entry(first, sbx.sandbox_id) is not None, 30, "the host back")
        back = ("sandhold_fleet_host_draining", (("host", first.settings["fleet_host_id"]),))
        wait_for(lambda: scrape(edge.url).get(back) == 0, 30, "the edge to see it back")
        resumed = Sandbox.connect(sbx.sandbox_id, timeout=300, **edge.sdk())
        assert host_of(first, sbx.sandbox_id)
        n1, secret1 = state(resumed)
        assert secret1 == secret and n1 > n0
    finally:
        sbx.kill()
