"""IPv6 forms of internal addresses, through the proxy of a real sandbox: each must be refused, and
the traps (tests/egress/traps.py: a loopback listener, the host's own address, and every routed
form in the test internet's namespace) must see no connection at all.

The operator here opened NAT64 and 6to4 (as on an IPv6-only host behind a NAT64 gateway), so
the blanket rule on those prefixes does not decide: the IPv4 address they embed must."""

from __future__ import annotations

import shlex
from collections.abc import AsyncIterator, Iterator

import pytest

from sandhold.runtime.runtime import Runtime
from tests.egress.fixtures import EgressSandboxes, runtime_over, settings_over
from tests.egress.internet import Internet
from tests.egress.traps import loopback_v4
from tests.runtime.helpers import sh

OPENED = ["64:ff9b::/96", "2002::/16"]

# A raw client in the sandbox: one request line on the proxy, the answer's status line and body.
ASK = """
import socket, sys
line, host = sys.argv[1], sys.argv[2]
s = socket.create_connection(("127.0.0.1", 3128), timeout=15)
s.sendall(f"{line}\\r\\nHost: {host}\\r\\nConnection: close\\r\\n\\r\\n".encode())
out = b""
try:
    while chunk := s.recv(65536):
        out += chunk
except TimeoutError:
    pass
head, _, body = out.decode("latin-1").partition("\\r\\n\\r\\n")
print(head.splitlines()[0] if head else "(nothing)")
print(body)
"""


@pytest.fixture(scope="module")
def opened_runtime(internet: Internet) -> Iterator[Runtime]:
    opened = [*OPENED, *internet.settings()["egress_open_cidrs"]]  # type: ignore[misc]
    yield from runtime_over(
        settings_over(internet, "sandhold-egress-nat64-", egress_open_cidrs=opened)
    )


@pytest.fixture
async def opened_sandbox(opened_runtime: Runtime) -> AsyncIterator[EgressSandboxes]:
    factory = EgressSandboxes(opened_runtime)
    yield factory
    await factory.cleanup()


def authorities(internet: Internet, form: str) -> list[str]:
    p = internet.trap.port if internet.trap else 0
    if form == "ipv4-mapped":
        return [f"[::ffff:{loopback_v4(internet.net)}]:{p}"]
    if form == "scope-id":  # the host's own address, with the scope written both ways
        return [f"[{internet.host_ip6}%25lo]:{p}", f"[{internet.host_ip6}%eth0]:{p}"]
    return [f"[{internet.trap_forms[form]}]:{p}"]


FORMS = [
    "ipv4-mapped",
    "ipv4-compatible",
    "ipv4-translated",
    "nat64",
    "6to4",
    "teredo",
    "isatap",
    "scope-id",
]


@pytest.mark.parametrize("form", FORMS)
async def test_ipv6_forms_of_internal_addresses_are_refused(opened_sandbox, internet, form):
    # Open mode, and rules that name every address: only the guard stands in the way.
    sbx = await opened_sandbox(mode="open", allow=["0.0.0.0/0", "::/0"])
    mark = internet.mark()
    for auth in authorities(internet, form):
        for line in (f"GET http://{auth}/ HTTP/1.1", f"CONNECT {auth} HTTP/1.1"):
            r = await ask(sbx, line, auth)
            status, _, body = r.partition("\n")
            assert status.startswith("HTTP/1.1 403"), (line, r)
            why = "an address of the sandbox host" if form == "scope-id" else "internal address"
            assert "blocked by internal" in body and why in body, (line, body)
            if form not in ("ipv4-mapped", "ipv4-compatible", "scope-id"):
                assert f"embeds {loopback_v4(internet.net)}" in body, body
    assert internet.trap_hits(mark) == 0


async def ask(sbx, line: str, host: str) -> str:
    r = await sh(sbx, f"python3 -c {shlex.quote(ASK)} {shlex.quote(line)} {shlex.quote(host)}")
    assert r.exit_code == 0, r.stderr.decode()
    return r.text
