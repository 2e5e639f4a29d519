"""A fleet's network on one machine (tests/fleet): a bridge in the benchmark range 198.19.N.0/24
(never an address outside this machine), and per host a network namespace joined to it by a
veth pair, with its own address. Each host is a `sandhold serve` in that namespace and in PID and
mount namespaces of its own, under `sandhold init` (a pod's shape): entered with ``nsenter
--net`` alone (``ip netns exec`` remounts /sys and hides the cgroup mounts).

The edges, PostgreSQL and the DNS server stay on loopback; the store (moto) listens on the
bridge's address, the one address of the root namespace the hosts can reach. ``close()``
removes the namespaces, the veths and the bridge.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

from tests.egress.internet import run, used_subnets
from tests.support.e2b_server import Server

INIT = [sys.executable, "-m", "sandhold.cli", "init", "--"]
CLONE_NEWNET = 0x40000000  # (os.setns is Python 3.12's)
_libc = ctypes.CDLL(None, use_errno=True)


class Network:
    def __init__(self) -> None:
        self.tag = secrets.token_hex(2)
        self.bridge = f"shfb{self.tag}"
        self.net = secrets.choice([n for n in range(16, 250) if n not in used_subnets("198.19.")])
        self.bridge_ip = f"198.19.{self.net}.1"
        self.namespaces: list[str] = []
        self.veths: list[str] = []
        try:
            run("ip", "link", "add", self.bridge, "type", "bridge")
            run("ip", "addr", "add", f"{self.bridge_ip}/24", "dev", self.bridge)
            run("ip", "link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise

    @property
    def cidr(self) -> str:
        return f"198.19.{self.net}.0/24"

    def add(self, index: int) -> tuple[str, str]:
        """A host's namespace on the bridge; its name and address."""
        ns, veth = f"shfn{self.tag}h{index}", f"shfv{self.tag}h{index}"
        ip = f"198.19.{self.net}.{10 + index}"
        run("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        self.veths.append(veth)
        run("ip", "link", "set", veth, "master", self.bridge, "up")
        run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        run("ip", "-n", ns, "link", "set", "eth0", "up")
        run("ip", "-n", ns, "link", "set", "lo", "up")
        return ns, ip

    def listen(self, ns: str, ip: str, port: int = 0) -> socket.socket:
        """A listening socket in ``ns`` at ``ip`` (made by a thread that enters the namespace:
        a network namespace is a thread's, and a socket keeps the one it was made in)."""
        made: list[socket.socket | BaseException] = []

        def inside() -> None:
            try:
                with open(f"/run/netns/{ns}") as f:
                    if _libc.setns(f.fileno(), CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), f"setns into {ns}")
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (a restart's)
                sock.bind((ip, port))
                sock.listen(2048)
                made.append(sock)
            except BaseException as e:
                made.append(e)

        t = threading.Thread(target=inside)  # it ends, and its namespace with it
        t.start()
        t.join()
        got = made[0]
        if isinstance(got, BaseException):
            raise got
        return got

    def cut(self, ns: str) -> None:
        """A partition: the host's namespace drops everything to and from the bridge's side."""
        rules = "\n".join(
            [
                "table inet shfleet {",
                f"  chain in {{ type filter hook input priority 0; ip saddr {self.cidr} drop; }}",
                f"  chain out {{ type filter hook output priority 0; ip daddr {self.cidr} drop; }}",
                "}",
            ]
        )
        subprocess.run(["nsenter", f"--net=/run/netns/{ns}", "nft", "-f", "-"], input=rules,
                       check=True, text=True)  # fmt: skip

    def heal(self, ns: str) -> None:
        run("nsenter", f"--net=/run/netns/{ns}", "nft", "delete", "table", "inet", "shfleet")

    def close(self) -> None:
        for veth in self.veths:
            subprocess.run(["ip", "link", "del", veth], capture_output=True)
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


HOST_PORT = 49982  # every host's, each in its own namespace (as on nodes): DNS gives addresses


def host_in(network: Network, index: int, server: Server, shared: Path | None = None) -> Server:
    """Put ``server`` (not started) in a namespace of ``network``: it serves on that namespace's
    address, in PID and mount namespaces of its own under `sandhold init`; with ``shared``, its
    own data dir is bound at that path (every host's volume at the same path: a pod's shape)."""
    ns, ip = network.add(index)
    server.sock.close()
    server.sock = network.listen(ns, ip, HOST_PORT)
    server.address, server.port = server.sock.getsockname()[:2]
    pod = ["unshare", "--pid", "--fork", "--mount", "--propagation", "private", "--mount-proc",
           "--kill-child=SIGTERM"]  # fmt: skip
    if shared is not None:
        bind = f'mount --bind {server.data_dir} {shared} && exec "$0" "$@"'
        pod += ["sh", "-c", bind]
        server.settings["data_dir"] = str(shared)
    server.under = ["nsenter", f"--net=/run/netns/{ns}", *pod, *INIT]
    server.pod = True
    server.namespace = ns  # type: ignore[attr-defined]
    return server


def relisten(network: Network, server: Server) -> None:
    """A new listening socket for a host whose old one was closed (a node's port refuses while
    nothing serves it; the test's open socket would queue connections instead)."""
    server.sock.close()
    server.sock = network.listen(server.namespace, server.address, HOST_PORT)  # type: ignore[attr-defined]


def kill_namespace(server: Server) -> None:
    """SIGKILL the PID 1 of the host's PID namespace (unshare's child): the kernel kills every
    process of the namespace with it, the server and its sandboxes."""
    assert server.proc is not None
    children = Path(f"/proc/{server.proc.pid}/task/{server.proc.pid}/children").read_text().split()
    os.kill(int(children[0]), signal.SIGKILL)
    server.proc.wait(30)
