"""The test "internet": HTTP, HTTPS and DNS servers run inside a network namespace the tests
create (``internet.py``), with a reflecting upstream under ``/reflect/`` (``reflector.py``).
Every request and DNS question they receive is appended to a JSONL log, so tests can assert
what did (and did not) reach the outside.

Run as ``python -m tests.egress.servers CONFIG_JSON`` inside the namespace.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import ssl
import struct
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from tests.egress.reflector import reflect

LOCK = threading.Lock()


def log(path: str, record: dict[str, object]) -> None:
    with LOCK, open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "testnet"
    cfg: dict[str, object] = {}
    scheme = "http"

    def log_message(self, *args: object) -> None:
        pass

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        auth = self.headers.get("Authorization") or ""
        url = urlsplit(self.path)
        q = parse_qs(url.query)
        log(
            str(self.cfg["log"]),
            {
                "kind": self.scheme,
                "server": self.server.server_address[0],
                "method": self.command,
                "path": self.path,
                "host": self.headers.get("Host"),
                "auth_sha256": hashlib.sha256(auth.encode()).hexdigest() if auth else None,
                "headers": sorted(k.lower() for k in self.headers),
                "accept_encoding": self.headers.get("Accept-Encoding"),
                "range": self.headers.get("Range"),
                "body_len": len(body),
            },
        )
        if url.path.startswith("/reflect/"):
            reflect(self, url.path.removeprefix("/reflect/"), q)
            return
        status, headers, out = 200, {"Content-Type": "text/plain"}, b""
        if url.path == "/auth":
            # Proves receipt of the credential without ever sending it back.
            out = ("auth-sha256=" + hashlib.sha256(auth.encode()).hexdigest()).encode()
        elif url.path == "/echo-headers":
            out = "".join(f"{k}: {v}\n" for k, v in self.headers.items()).encode()
            headers["X-Echo-Authorization"] = auth
        elif url.path == "/redirect":
            status, headers["Location"] = 302, q.get("to", ["/"])[0]
        elif url.path == "/bytes":
            out = b"x" * int(q.get("n", ["1024"])[0])
        elif url.path.startswith("/files/"):  # e.g. a package index a test wrote
            root = os.path.realpath(str(self.cfg["files"]))
            path = os.path.realpath(os.path.join(root, url.path.removeprefix("/files/")))
            if os.path.isdir(path):
                path = os.path.join(path, "index.html")
            if path.startswith(root + os.sep) and os.path.isfile(path):
                with open(path, "rb") as f:
                    out = f.read()
                headers["Content-Type"] = "text/html" if path.endswith(".html") else (
                    "application/octet-stream")  # fmt: skip
            else:
                status, out = 404, b"not found\n"
        else:
            out = f"hello from {self.server.server_address[0]} via {self.scheme}\n".encode()
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(out)

    do_GET = do_POST = do_PUT = do_HEAD = do_DELETE = _handle


class Server6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def serve_http(addr: str, port: int, cfg: dict[str, object], tls: ssl.SSLContext | None) -> None:
    handler = type("H", (Handler,), {"cfg": cfg, "scheme": "https" if tls else "http"})
    srv = (Server6 if ":" in addr else ThreadingHTTPServer)((addr, port), handler)
    srv.daemon_threads = True
    if tls is not None:
        srv.socket = tls.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()


def serve_dns(addr: str, names: dict[str, str], logfile: str) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((addr, 53))

    def loop() -> None:
        while True:
            msg, peer = sock.recvfrom(4096)
            try:
                qid, _flags = struct.unpack("!HH", msg[:4])
                p, labels = 12, []
                while msg[p]:
                    labels.append(msg[p + 1 : p + 1 + msg[p]].decode())
                    p += 1 + msg[p]
                qtype = struct.unpack("!H", msg[p + 1 : p + 3])[0]
                question = msg[12 : p + 5]
            except (IndexError, struct.error, UnicodeDecodeError):
                continue
            name = ".".join(labels).lower()
            log(logfile, {"kind": "dns", "name": name, "qtype": qtype})
            ip = names.get(name)
            if ip is None:
                reply = struct.pack("!HHHHHH", qid, 0x8183, 1, 0, 0, 0) + question
            elif qtype == 1:
                rr = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 5, 4) + socket.inet_aton(ip)
                reply = struct.pack("!HHHHHH", qid, 0x8180, 1, 1, 0, 0) + question + rr
            else:
                reply = struct.pack("!HHHHHH", qid, 0x8180, 1, 0, 0, 0) + question
            sock.sendto(reply, peer)

    threading.Thread(target=loop, daemon=True).start()


def main() -> None:
    cfg = json.loads(sys.argv[1])
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cfg["cert"], cfg["key"])
    for addr in cfg["addrs"]:
        serve_http(addr, 80, cfg, None)
        serve_http(addr, 443, cfg, tls)
    for addr in cfg.get("traps", []):  # IPv6 forms of loopback: anything reaching them is logged
        serve_http(addr, cfg["trap_port"], cfg, None)
    serve_dns(cfg["addrs"][0], cfg["names"], cfg["log"])
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
