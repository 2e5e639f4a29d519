"""Every body the gateway reads is bounded before it is read whole: a tool call's
(gateway_max_payload_bytes), the console API's (64 KiB) and a tunnel's record (64 KiB) are
refused with 413 after at most their first MiB of a 1 GiB body (before http_edge, the console's
and the tunnel admin's were read whole, then judged)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.support.gateway_server import ADMIN_KEY, TENANT_KEY, Gateway
from tests.support.http import announced


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize(("key", "path", "bound"), [
    (TENANT_KEY, "/v1/sessions/s-edge/tools/run_command", b"gateway_max_payload_bytes"),
    (ADMIN_KEY, "/console/api/sessions", b"64 KiB"),
    (ADMIN_KEY, "/v1/admin/tenants/acme/tunnels", b"64 KiB"),
])  # fmt: skip
def test_a_huge_body_is_refused_before_it_is_read(
    make_gateway: Callable[..., Gateway], key: str, path: str, bound: bytes, chunked: bool
) -> None:
    gw = make_gateway()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    answer = announced(gw.port, "POST", path, 1 << 30, headers, chunked)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:300]
    assert bound in answer, answer
