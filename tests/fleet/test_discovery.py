"""The edge's kubernetes discovery (fleet/discovery.py) against a stand-in for the Kubernetes API:
a real HTTP server in this test (no API server can run on these machines), serving an
EndpointSliceList. It must ask with the pod's service account token for the Service's slices,
and take the endpoints that serve and those that terminate (draining), not the others."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from sandhold.config import Settings
from sandhold.errors import ConfigError
from sandhold.fleet import discovery

SLICES = {
    "kind": "EndpointSliceList",
    "apiVersion": "discovery.k8s.io/v1",
    "items": [
        {
            "addressType": "IPv4",
            "ports": [{"name": "api", "port": 49982, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": ["10.1.0.11"], "conditions": {"ready": True, "serving": True}},
                {"addresses": ["10.1.0.12"],  # draining: not ready, terminating
                 "conditions": {"ready": False, "serving": False, "terminating": True}},
                {"addresses": ["10.1.0.13"],  # starting, or failing its probe
                 "conditions": {"ready": False, "serving": False, "terminating": False}},
            ],
        },
        {
            "addressType": "IPv6",
            "ports": [{"name": "api", "port": 49982}],
            "endpoints": [{"addresses": ["fd00::14"], "conditions": {}}],  # unknown: ready
        },
    ],
}  # fmt: skip


@pytest.fixture
def api() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append({"path": self.path, "auth": self.headers.get("Authorization")})
            body = json.dumps(SLICES).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def test_endpoint_slices_that_serve_or_drain_are_the_hosts(
    api, tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    url, seen = api
    (tmp_path / "token").write_text("the-pods-token\n")
    (tmp_path / "namespace").write_text("sandhold\n")
    monkeypatch.setattr(discovery, "ACCOUNT", tmp_path)
    settings = Settings(
        fleet_discovery="kubernetes", fleet_kubernetes_api=url, fleet_dns_name="sandhold-hosts"
    )
    got = asyncio.run(discovery.Discovery(settings).addresses())
    assert got == ["http://10.1.0.11:49982", "http://10.1.0.12:49982", "http://[fd00::14]:49982"]
    (request,) = seen
    assert request["auth"] == "Bearer the-pods-token"
    assert request["path"] == (
        "/apis/discovery.k8s.io/v1/namespaces/sandhold/endpointslices"
        "?labelSelector=kubernetes.io%2Fservice-name%3Dsandhold-hosts"
    )


def test_outside_a_pod_the_api_must_be_given(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    settings = Settings(fleet_discovery="kubernetes", fleet_kubernetes_namespace="sandhold")
    with pytest.raises(ConfigError, match="fleet_kubernetes_api"):
        asyncio.run(discovery.Discovery(settings).addresses())
