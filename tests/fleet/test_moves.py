"""Sandboxes that outlive their host (docs/fleet.md): a paused sandbox kept in the shared store
(moto S3 here) resumes on another host after its own is killed, with its memory and files; a
draining host hands every sandbox over and exits; a host restarted in place takes its own back
without a download."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox
from e2b.exceptions import ServiceBusyException

from sandhold.config import Settings
from sandhold.runtime.checkpoint.criu import criu_status
from tests.counter import COUNTER
from tests.e2b.test_suspend import state
from tests.fleet.harness import Edge, catalog_url, host_of, new_host, s3_store, wait_for
from tests.support.e2b_server import Server

STORE_AFTER_S = "0.5"


@pytest.fixture(scope="module")
def fleet(postgres, tmp_path_factory) -> Iterator[tuple[list[Server], Edge]]:  # type: ignore[no-untyped-def]
    ok, detail = criu_status(Settings().criu_path)
    if not ok:
        pytest.skip(f"CRIU unusable here: {detail}")
    tmp: Path = tmp_path_factory.mktemp("fleet-moves")
    with s3_store() as store:
        hosts = [
            new_host(tmp, f"m{i}", fleet_store_after_s=STORE_AFTER_S, **store) for i in (1, 2)
        ]
        edge = Edge(tmp, catalog_url(postgres), hosts)
        try:
            for h in hosts:
                h.start()
            edge.start()
            yield hosts, edge
        finally:
            edge.stop()
            for h in hosts:
                h.destroy()


def stored(host: Server, sandbox_id: str) -> bool:
    import httpx

    from tests.fleet.harness import TOKEN

    r = httpx.get(f"{host.url}/fleet/sandboxes/{sandbox_id}",
                  headers={"X-Sandhold-Fleet-Token": TOKEN}, timeout=10)  # fmt: skip
    return r.status_code == 200 and r.json()["stored"]


def test_a_stored_sandbox_resumes_on_another_host_after_its_own_is_killed(fleet) -> None:  # type: ignore[no-untyped-def]
    hosts, edge = fleet
    sbx = Sandbox.create(timeout=300, **edge.sdk())
    first = next(h for h in hosts if host_of(h, sbx.sandbox_id))
    other = next(h for h in hosts if h is not first)
    try:
        sbx.commands.run(COUNTER, background=True)
        n0, secret = state(sbx)
        sbx.files.write("/home/user/notes.txt", "kept")
        sbx.pause()
        wait_for(lambda: stored(first, sbx.sandbox_id), 60, "the paused sandbox to be stored")
        first.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        first.proc.wait()  # type: ignore[union-attr]
        first.sock.close()

        def released() -> bool:  # once the edge has judged the host lost
            try:
                return Sandbox.get_info(sbx.sandbox_id, **edge.sdk()).state.value == "paused"
            except ServiceBusyException:
                return False

        wait_for(released, 30, "the lost host's stored sandbox to be released")
        resumed = Sandbox.connect(sbx.sandbox_id, timeout=300, **edge.sdk())
        assert host_of(other, sbx.sandbox_id)  # the same id, on the other host
        n1, secret1 = state(resumed)
        assert secret1 == secret and n1 > n0  # the same process, its memory carried over
        assert resumed.files.read("/home/user/notes.txt") == "kept"
    finally:
        sbx.kill()
        first.proc = None  # (the fixture's destroy cleans what the kill left)
