"""A private "internet" for egress tests and the bench: a network namespace reached from the
host over a veth pair, in the benchmark range 198.18.0.0/15 (never an address outside this
machine), running ``servers.py`` (HTTP, HTTPS with a test CA, DNS) on three addresses:

- ``.2``: ``api.example.test``, ``other.example.test``, ``cdn.example.test`` (and the DNS server)
- ``.3``: ``evil.test`` (must never receive anything in the attack tests)
- ``.4``: ``plain.example.test``

and names that resolve to internal addresses (``rebind.example.test`` → 127.0.0.1, etc.). The
veth also carries IPv6 (``2001:2:0:N::/64``, the benchmark range), and the IPv6 forms of a
loopback address that the guard tests use are routed into the namespace (``traps.py``).
Everything it creates is removed by ``close()``: the servers, the namespace and the veth (with
it, its routes).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.egress.traps import Trap, loopback_v4, routed_forms

REPO = Path(__file__).resolve().parents[2]
NAMES = (
    "api.example.test",
    "other.example.test",
    "cdn.example.test",
    "evil.test",
    "plain.example.test",
)


def run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def used_subnets(prefix: str) -> set[int]:
    """The third octets in use on this machine under ``prefix`` ("198.18.")."""
    used = set()
    for link in json.loads(run("ip", "-j", "addr", "show")):
        for a in link.get("addr_info", []):
            if a.get("local", "").startswith(prefix):
                used.add(int(a["local"].split(".")[2]))
    return used


def make_ca(directory: Path) -> tuple[Path, Path, Path]:
    """A test CA and a server certificate for every test name; returns (ca, cert, key)."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sandhold test internet CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in NAMES]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NAMES[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


class Internet:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        tag = secrets.token_hex(3)
        self.ns = f"shnet-{tag}"
        self.veth_host = f"shh{tag}"
        self.veth_ns = f"shn{tag}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.dir / "requests.jsonl"
        self.log.touch()
        self.files = self.dir / "files"  # served at /files/ (a directory: its index.html)
        self.files.mkdir(exist_ok=True)
        self.ca, self.cert, self.key = make_ca(self.dir)
        free = [n for n in range(16, 250) if n not in used_subnets("198.18.")]
        self.net = secrets.choice(free)
        self.host_ip = f"198.18.{self.net}.1"
        self.api_ip = f"198.18.{self.net}.2"
        self.evil_ip = f"198.18.{self.net}.3"
        self.plain_ip = f"198.18.{self.net}.4"
        self.host_ip6 = f"2001:2:0:{self.net:x}::1"
        self.ns_ip6 = f"2001:2:0:{self.net:x}::2"
        self.trap_forms = routed_forms(self.net, self.api_ip)
        self.trap: Trap | None = None
        self.names = {
            "api.example.test": self.api_ip,
            "other.example.test": self.api_ip,
            "cdn.example.test": self.api_ip,
            "evil.test": self.evil_ip,
            "plain.example.test": self.plain_ip,
            "rebind.example.test": "127.0.0.1",
            "metadata.example.test": "169.254.169.254",
            "private.example.test": "10.1.2.3",
            "hostaddr.example.test": self.host_ip,
            "spoofed.example.test": self.evil_ip,
        }
        try:
            self._up()
        except BaseException:
            self.close()
            raise

    def _up(self) -> None:
        run("ip", "netns", "add", self.ns)
        run(
            "ip",
            "link",
            "add",
            self.veth_host,
            "type",
            "veth",
            "peer",
            "name",
            self.veth_ns,
            "netns",
            self.ns,
        )
        run("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.veth_host)
        run("ip", "link", "set", self.veth_host, "up")
        for ip in (self.api_ip, self.evil_ip, self.plain_ip):
            run("ip", "-n", self.ns, "addr", "add", f"{ip}/24", "dev", self.veth_ns)
        run("ip", "-n", self.ns, "link", "set", self.veth_ns, "up")
        run("ip", "-n", self.ns, "link", "set", "lo", "up")
        run("ip", "addr", "add", f"{self.host_ip6}/64", "dev", self.veth_host, "nodad")
        run("ip", "-n", self.ns, "addr", "add", f"{self.ns_ip6}/64", "dev", self.veth_ns, "nodad")
        for addr in self.trap_forms.values():
            run("ip", "-n", self.ns, "addr", "add", f"{addr}/128", "dev", "lo", "nodad")
            run(
                "ip", "-6", "route", "add", f"{addr}/128", "via", self.ns_ip6, "dev", self.veth_host
            )
        # The forms the host delivers itself: the IPv4-mapped one, and the host's own address.
        self.trap = Trap([loopback_v4(self.net), self.host_ip6])
        cfg = {
            "traps": list(self.trap_forms.values()),
            "trap_port": self.trap.port,
            "addrs": [self.api_ip, self.evil_ip, self.plain_ip],
            "cert": str(self.cert),
            "key": str(self.key),
            "log": str(self.log),
            "names": self.names,
            "files": str(self.files),
        }
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                self.ns,
                sys.executable,
                "-m",
                "tests.egress.servers",
                json.dumps(cfg),
            ],
            stdout=subprocess.PIPE,
            env=env,
            cwd=REPO,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != b"ready":
            raise RuntimeError("the test internet's servers did not start")

    def settings(self) -> dict[str, object]:
        """Settings that point the egress proxy at this internet, whose ranges the operator
        opens: they are not globally routable (198.18.0.0/15 and 2001:2::/48 are for
        benchmarks), so the guard refuses them otherwise."""
        return {
            "egress_open_cidrs": [f"198.18.{self.net}.0/24", f"2001:2:0:{self.net:x}::/64"],
            "egress_dns_servers": [self.api_ip],
            "egress_upstream_ca_file": self.ca,
            "egress_sandbox_ca_files": [self.ca],
        }

    def server_settings(self) -> dict[str, str]:
        """``settings()`` as a server process takes them (``SANDHOLD_*``: lists as JSON)."""
        return {
            k: json.dumps([str(x) for x in v]) if isinstance(v, list) else str(v)
            for k, v in self.settings().items()
        }

    def requests(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]

    def mark(self) -> int:
        return len(self.requests())

    def since(self, mark: int) -> list[dict[str, object]]:
        return self.requests()[mark:]

    def trap_hits(self, mark: int) -> int:
        """Connections the traps saw: on the host, and in the namespace since ``mark``."""
        traps = {ipaddress.ip_address(a) for a in self.trap_forms.values()}
        hits = self.trap.hits if self.trap is not None else 0
        return hits + len([r for r in self.since(mark) if _ip(r.get("server")) in traps])

    def close(self) -> None:
        if self.trap is not None:
            self.trap.close()
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()  # the "ready" pipe
            self.proc = None
        subprocess.run(["ip", "link", "del", self.veth_host], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and self.exists():
            time.sleep(0.05)

    def exists(self) -> bool:
        return self.ns in run("ip", "netns", "list") or bool(
            subprocess.run(["ip", "link", "show", self.veth_host], capture_output=True).returncode
            == 0
        )


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


def _ip(text: object) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(str(text))
    except ValueError:
        return None
