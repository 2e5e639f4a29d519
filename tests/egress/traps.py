"""Traps for the internal-range guard: IPv6 forms of a loopback address, each of which the egress
proxy must refuse, and listeners that count who reached them.

Every form embeds ``127.N.0.1`` (N: the test internet's subnet, so parallel test sessions do not
collide). Where the host kernel would deliver a form itself (IPv4-mapped: to ``127.N.0.1``; the
scoped form: to the host's own address), a ``Trap`` on the host listens. Every other form is
routed by the test internet into its own namespace, where the servers listen on it: a proxy that
let one through would be logged there, and nothing ever leaves this machine.
"""

from __future__ import annotations

import ipaddress
import socket
import threading


def loopback_v4(net: int) -> str:
    return f"127.{net}.0.1"


def routed_forms(net: int, teredo_server: str) -> dict[str, str]:
    """Forms the host cannot deliver itself: routed into the test internet's namespace."""
    v4 = int(ipaddress.IPv4Address(loopback_v4(net)))
    server = int(ipaddress.IPv4Address(teredo_server))
    isatap_prefix = int(ipaddress.IPv6Address(f"2001:2:1:{net:x}::"))
    return {
        "ipv4-compatible": str(ipaddress.IPv6Address(v4)),
        "ipv4-translated": str(ipaddress.IPv6Address((0xFFFF << 48) | v4)),
        "nat64": str(ipaddress.IPv6Address((0x64FF9B << 96) | v4)),
        "6to4": str(ipaddress.IPv6Address((0x2002 << 112) | (v4 << 80) | 1)),
        # Teredo: 2001:0:<server>:<flags>:<port>:<client xor 0xffffffff>
        "teredo": str(ipaddress.IPv6Address((0x20010000 << 96) | (server << 64) | v4 ^ 0xFFFFFFFF)),
        "isatap": str(ipaddress.IPv6Address(isatap_prefix | (0x5EFE << 32) | v4)),
    }


class Trap:
    """TCP listeners on one port of several host addresses, counting every connection."""

    def __init__(self, addrs: list[str]) -> None:
        self.hits = 0
        self.socks: list[socket.socket] = []
        for _ in range(50):  # one port free on every address
            self.close()
            try:
                port = 0
                for a in addrs:
                    fam = socket.AF_INET6 if ":" in a else socket.AF_INET
                    s = socket.socket(fam, socket.SOCK_STREAM)
                    self.socks.append(s)
                    s.bind((a, port))
                    port = s.getsockname()[1]
                break
            except OSError:
                continue
        else:
            raise RuntimeError(f"no port is free on every trap address {addrs}")
        self.port = port
        for s in self.socks:
            s.listen(16)
            threading.Thread(target=self._loop, args=(s,), daemon=True).start()

    def _loop(self, s: socket.socket) -> None:
        while True:
            try:
                conn, _ = s.accept()
            except OSError:
                return
            self.hits += 1
            conn.close()

    def close(self) -> None:
        for s in self.socks:
            try:
                s.shutdown(socket.SHUT_RDWR)  # wakes the accept of a listening socket
            except OSError:
                pass
            s.close()
        self.socks = []
