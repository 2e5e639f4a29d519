"""A fleet on one machine for tests: ``sandhold serve`` hosts (each its own data dir, and so its
own cgroup parent) and ``sandhold edge serve`` replicas over one PostgreSQL catalog, all on
loopback, driven by the official SDK through an edge."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import httpx
import pytest
from moto.server import ThreadedMotoServer

from tests.support.e2b_server import API_KEYS, KEY_A, Server, listen, new_server, start_process
from tests.support.e2b_server import stop_process as stop

TOKEN = "fleet-test-token-" + "x" * 16
POLL_S = 0.3
LOST_AFTER_S = 3.0


def new_host(tmp: Path, host_id: str, capacity: int = 8, **settings: str) -> Server:
    return new_server(
        tmp, fleet_host_id=host_id, fleet_token=TOKEN, fleet_capacity=str(capacity), **settings
    )


class Edge:
    """`sandhold edge serve` on loopback; static discovery of ``hosts`` unless ``settings``
    say otherwise (``fleet_discovery="dns"``, ...)."""

    def __init__(self, tmp: Path, catalog_url: str, hosts: list[Server], **settings: str) -> None:
        self.sock = listen()
        self.port = self.sock.getsockname()[1]
        self.data_dir = Path(tempfile.mkdtemp(prefix="sandhold-edge-", dir=tmp))
        self.log = tmp / f"edge-{self.port}.log"
        self.catalog_url = catalog_url
        self.hosts = hosts
        self.settings = settings
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_")}
        env.update(
            SANDHOLD_DATA_DIR=str(self.data_dir),
            SANDHOLD_API_KEYS=json.dumps(API_KEYS),
            SANDHOLD_FLEET_TOKEN=TOKEN,
            SANDHOLD_FLEET_CATALOG_URL=self.catalog_url,
            SANDHOLD_FLEET_DISCOVERY="static",
            SANDHOLD_FLEET_HOSTS=json.dumps([h.url for h in self.hosts]),
            SANDHOLD_FLEET_POLL_S=str(POLL_S),
            SANDHOLD_FLEET_LOST_AFTER_S=str(LOST_AFTER_S),
            NO_PROXY="127.0.0.1,localhost",
        )
        env.update({f"SANDHOLD_{k.upper()}": v for k, v in self.settings.items()})
        self.proc = start_process(["edge", "serve"], env, self.log, self.sock)

    def stop(self) -> None:
        stop(self.proc)
        self.proc = None
        self.sock.close()

    def sdk(self, key: str = KEY_A) -> dict[str, str]:
        return {"api_url": self.url, "sandbox_url": self.url, "api_key": key}


@contextlib.contextmanager
def running(hosts: list[Server], edges: list[Edge]) -> Iterator[None]:
    """The hosts started, then the edges; afterwards the edges stopped and the hosts destroyed
    (their sandboxes, data dirs, cgroups), whatever failed on the way."""
    try:
        for h in hosts:
            h.start()
        for e in edges:
            e.start()
        yield
    finally:
        for e in edges:
            e.stop()
        for h in hosts:
            h.destroy()


def catalog_url(postgres: object) -> str:
    return postgres.database(f"fleet{uuid.uuid4().hex[:10]}")  # type: ignore[attr-defined]


def entry(host: Server, sandbox_id: str, timeout: float = 10) -> dict[str, object] | None:
    """The host's own word on the sandbox (its fleet API), None if it does not hold it."""
    r = httpx.get(f"{host.url}/fleet/sandboxes/{sandbox_id}",
                  headers={"X-Sandhold-Fleet-Token": TOKEN}, timeout=timeout)  # fmt: skip
    return r.json() if r.status_code == 200 else None


def host_of(host: Server, sandbox_id: str) -> bool:
    """Whether ``host`` holds the sandbox (a host that does not answer holds nothing)."""
    try:
        return entry(host, sandbox_id, timeout=3) is not None
    except httpx.HTTPError:
        return False


def wait_for(check, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


BUCKET = "fleet-store"


@contextlib.contextmanager
def s3_store(ip: str = "127.0.0.1") -> Iterator[dict[str, str]]:
    """A moto S3 server at ``ip`` with the store's bucket; the hosts' settings for it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_ACCESS_KEY_ID", "test")  # the hosts inherit these (boto3's chain)
        mp.setenv("AWS_SECRET_ACCESS_KEY", "test")
        moto = ThreadedMotoServer(ip_address=ip, port=0, verbose=False)
        moto.start()
        try:
            host, port = moto.get_host_and_port()
            endpoint = f"http://{host}:{port}"
            boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
                Bucket=BUCKET
            )
            key = base64.urlsafe_b64encode(os.urandom(32)).decode()
            yield {
                "snapshot_s3_bucket": BUCKET,
                "snapshot_s3_prefix": "sandhold/",
                "snapshot_s3_endpoint_url": endpoint,
                "snapshot_s3_region": "us-east-1",
                "secrets_keys": f'["{key}"]',  # the same on every host
            }
        finally:
            moto.stop()


def scrape(url: str, key: str = KEY_A) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A /metrics page: (sample name, its labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", headers={"X-API-KEY": key}, timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> float:
    return sum(v for (n, _), v in metrics.items() if n == name)
