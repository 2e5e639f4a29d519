"""The little of the DNS wire format the egress path needs (RFC 1035): parse a one-question
query, build answers with A/AAAA records or an error code, and parse an upstream answer. A
malformed message raises ``InvalidRequest``.

Sandboxes send their queries to the proxy (the agent's stub relays them as RFC 8484 DNS
messages), which answers them itself: names the policy does not allow get NXDOMAIN without any
upstream lookup, and only A/AAAA are ever looked up, so DNS carries no data out.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

from sandhold.errors import InvalidRequest

TYPE_A = 1
TYPE_AAAA = 28
CLASS_IN = 1
RCODE_OK = 0
RCODE_FORMERR = 1
RCODE_SERVFAIL = 2
RCODE_NXDOMAIN = 3
RCODE_REFUSED = 5
MAX_MESSAGE = 4096


@dataclass
class Question:
    id: int
    flags: int
    name: str
    qtype: int
    qclass: int
    raw_question: bytes  # echoed back in the answer


def _read_name(msg: bytes, offset: int, depth: int = 0) -> tuple[str, int]:
    labels = []
    while True:
        if offset >= len(msg):
            raise InvalidRequest("truncated name")
        length = msg[offset]
        if length == 0:
            offset += 1
            break
        if length & 0xC0 == 0xC0:  # compression pointer (upstream answers only)
            if depth > 8 or offset + 1 >= len(msg):
                raise InvalidRequest("bad compression pointer")
            ptr = struct.unpack("!H", msg[offset : offset + 2])[0] & 0x3FFF
            rest, _ = _read_name(msg, ptr, depth + 1)
            labels.append(rest)
            return ".".join(x for x in labels if x), offset + 2
        if length > 63:
            raise InvalidRequest("label too long")
        label = msg[offset + 1 : offset + 1 + length]
        if len(label) != length:
            raise InvalidRequest("truncated label")
        labels.append(label.decode("ascii", "replace"))
        offset += 1 + length
    return ".".join(labels), offset


def encode_name(name: str) -> bytes:
    out = b""
    for label in name.rstrip(".").split("."):
        if not label:
            continue
        raw = label.encode("ascii")
        if len(raw) > 63:
            raise InvalidRequest("label too long")
        out += bytes([len(raw)]) + raw
    return out + b"\0"


def parse_query(msg: bytes) -> Question:
    if len(msg) < 12 or len(msg) > MAX_MESSAGE:
        raise InvalidRequest("message too short or too long")
    qid, flags, qdcount = struct.unpack("!HHH", msg[:6])
    if flags & 0x8000 or qdcount != 1:
        raise InvalidRequest("expected one question")
    name, end = _read_name(msg, 12)
    if end + 4 > len(msg):
        raise InvalidRequest("truncated question")
    qtype, qclass = struct.unpack("!HH", msg[end : end + 4])
    return Question(qid, flags, name.lower(), qtype, qclass, msg[12 : end + 4])


def answer(q: Question, rcode: int, addrs: list[str] | None = None, ttl: int = 30) -> bytes:
    """A response to ``q``: the records of ``addrs`` that match its type, or just ``rcode``."""
    records = b""
    count = 0
    for a in addrs or []:
        ip = ipaddress.ip_address(a)
        rtype = TYPE_A if ip.version == 4 else TYPE_AAAA
        if rtype != q.qtype:
            continue
        records += b"\xc0\x0c" + struct.pack("!HHIH", rtype, CLASS_IN, ttl, len(ip.packed))
        records += ip.packed
        count += 1
    rd = q.flags & 0x0100
    flags = 0x8000 | rd | 0x0080 | (rcode & 0xF)  # QR, RD copied, RA
    return struct.pack("!HHHHHH", q.id, flags, 1, count, 0, 0) + q.raw_question + records


def error_reply(msg: bytes, rcode: int) -> bytes:
    """FORMERR/REFUSED for a query we could not even parse (echo the id if there is one)."""
    qid = struct.unpack("!H", msg[:2])[0] if len(msg) >= 2 else 0
    return struct.pack("!HHHHHH", qid, 0x8080 | rcode, 0, 0, 0, 0)


def build_query(qid: int, name: str, qtype: int) -> bytes:
    header = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    return header + encode_name(name) + struct.pack("!HH", qtype, CLASS_IN)


def parse_answer(msg: bytes, qid: int) -> tuple[int, list[str], int]:
    """(rcode, addresses, min ttl) of an upstream response to query ``qid``."""
    if len(msg) < 12:
        raise InvalidRequest("short answer")
    rid, flags, qd, an = struct.unpack("!HHHH", msg[:8])
    if rid != qid or not flags & 0x8000:
        raise InvalidRequest("answer does not match the query")
    offset = 12
    for _ in range(qd):
        _, offset = _read_name(msg, offset)
        offset += 4
    addrs, ttl = [], 3600
    for _ in range(an):
        _, offset = _read_name(msg, offset)
        if offset + 10 > len(msg):
            raise InvalidRequest("truncated record")
        rtype, _cls, rttl, rdlen = struct.unpack("!HHIH", msg[offset : offset + 10])
        offset += 10
        data = msg[offset : offset + rdlen]
        offset += rdlen
        if rtype == TYPE_A and rdlen == 4:
            addrs.append(str(ipaddress.IPv4Address(data)))
            ttl = min(ttl, rttl)
        elif rtype == TYPE_AAAA and rdlen == 16:
            addrs.append(str(ipaddress.IPv6Address(data)))
            ttl = min(ttl, rttl)
    return flags & 0xF, addrs, ttl
