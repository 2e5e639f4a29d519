"""A DNS server on loopback standing in for a Kubernetes headless Service: A records of one name,
changed by the test as hosts come and go (``records``)."""

from __future__ import annotations

import socket
import threading

import dns.flags
import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset


class HeadlessService:
    def __init__(self, name: str) -> None:
        self.name = name.rstrip(".") + "."
        self.records: list[str] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.address = "{}:{}".format(*self.sock.getsockname())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, peer = self.sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                query = dns.message.from_wire(data)
            except Exception:
                continue
            answer = dns.message.make_response(query)
            answer.flags |= dns.flags.AA
            question = query.question[0]
            if question.name.to_text().lower() != self.name:
                answer.set_rcode(dns.rcode.NXDOMAIN)
            elif question.rdtype == dns.rdatatype.A and self.records:
                answer.answer.append(
                    dns.rrset.from_text_list(self.name, 1, "IN", "A", list(self.records))
                )
            self.sock.sendto(answer.to_wire(), peer)

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join(5)
