"""Egress proxy overhead and throughput, measured in one run against the test internet.

    .venv/bin/python bench/egress_bench.py [--n 300] [--clients 16] [--seconds 5]
        [--out bench/results/egress.json]

Direct: the bench process talks to the test servers itself. Proxied: it talks to a sandbox's
egress socket (exactly what the sandbox's agent forwards 127.0.0.1:3128 to), so the figures are
the proxy's cost alone; ``in_sandbox`` adds the whole path from a process inside the sandbox
(agent forwarder included). Three shapes: plain HTTP, HTTPS tunnelled (CONNECT, TLS end to end)
and HTTPS with credential injection (TLS terminated and re-originated by the proxy). Each
request opens a fresh connection (and TLS session), both direct and proxied.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.egress.internet import Internet
from tests.runtime.helpers import py

from benchstats import write_result
from sandhold.config import Settings
from sandhold.egress.secrets import open_store
from sandhold.runtime import cgroups
from sandhold.runtime.runtime import Runtime


async def _read_all(reader: asyncio.StreamReader) -> int:
    n = 0
    while data := await reader.read(65536):
        n += len(data)
    return n


class Client:
    def __init__(self, net: Internet, sock: Path, ca_bundle: Path) -> None:
        self.net = net
        self.sock = str(sock)
        self.tls = ssl.create_default_context(cafile=str(ca_bundle))

    async def request(self, how: str, shape: str, size: int) -> int:
        host = {
            "http": "plain.example.test",
            "tunnel": "other.example.test",
            "inject": "api.example.test",
        }[shape]
        path = f"/bytes?n={size}"
        req = f"GET {{}} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        if how == "direct":
            addr = self.net.plain_ip if shape == "http" else self.net.api_ip
            if shape == "http":
                r, w = await asyncio.open_connection(addr, 80)
            else:
                r, w = await asyncio.open_connection(addr, 443, ssl=self.tls, server_hostname=host)
            w.write(req.format(path).encode())
        else:
            r, w = await asyncio.open_unix_connection(self.sock)
            if shape == "http":
                w.write(req.format(f"http://{host}{path}").encode())
            else:
                w.write(f"CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n\r\n".encode())
                head = await r.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200"), head
                await w.start_tls(self.tls, server_hostname=host)
                w.write(req.format(path).encode())
        n = await _read_all(r)
        w.close()
        return n


async def latency(client: Client, how: str, shape: str, n: int) -> dict[str, float]:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        await client.request(how, shape, 64)
        times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    return {
        "median_ms": round(statistics.median(times), 3),
        "p95_ms": round(times[int(len(times) * 0.95) - 1], 3),
    }


async def throughput(
    client: Client, how: str, shape: str, size: int, clients: int, seconds: float
) -> dict[str, float]:
    done = 0
    nbytes = 0
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done, nbytes
        while time.perf_counter() < stop:
            got = await client.request(how, shape, size)  # not `nbytes += await`: it races
            nbytes += got
            done += 1

    t = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    elapsed = time.perf_counter() - t
    return {
        "requests_per_s": round(done / elapsed, 1),
        "mb_per_s": round(nbytes / elapsed / 1e6, 2),
    }


IN_SANDBOX = """
import time, urllib.request, statistics
def run(url, n):
    ts = []
    for _ in range(n):
        t = time.perf_counter(); urllib.request.urlopen(url, timeout=10).read()
        ts.append((time.perf_counter() - t) * 1e3)
    return round(statistics.median(ts), 3)
print(run('http://plain.example.test/bytes?n=64', N),
      run('https://other.example.test/bytes?n=64', N),
      run('https://api.example.test/bytes?n=64', N))
"""


async def main() -> dict[str, object]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--out", default="bench/results/egress.json")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sandhold-egress-bench-", dir="/var/tmp"))
    tmp.chmod(0o755)
    net = Internet(tmp / "net")
    settings = Settings(data_dir=tmp / "data", **net.settings())  # type: ignore[arg-type]
    rt = Runtime(settings).open()
    try:
        rt.templates.get("base")
        open_store(Settings(data_dir=settings.data_dir)).set(
            "bench", "tok", "bench-secret-value", ["api.example.test"]
        )
        sbx = rt.create(
            {"network": {"mode": "allowlist", "allow": ["*.example.test"], "tenant": "bench"}}
        )
        bundle = sbx.dir / "egress" / "ca-bundle.pem"  # test CA + the deployment's egress CA
        client = Client(net, sbx.dir / "egress" / "proxy.sock", bundle)
        result: dict[str, object] = {"n": args.n, "clients": args.clients, "seconds": args.seconds}
        lat: dict[str, object] = {}
        for shape in ("http", "tunnel", "inject"):
            for how in ("direct", "proxy"):
                if shape == "inject" and how == "direct":
                    continue  # nothing to compare against: direct has no credential step
                await client.request(how, shape, 64)  # warm caches (DNS, leaf certificate)
                lat[f"{shape}_{how}"] = await latency(client, how, shape, args.n)
        for shape in ("http", "tunnel"):
            lat[f"{shape}_overhead_ms"] = round(
                lat[f"{shape}_proxy"]["median_ms"] - lat[f"{shape}_direct"]["median_ms"],
                3,  # type: ignore[index]
            )
        result["latency_per_request"] = lat
        tp: dict[str, object] = {}
        for label, size in (("small_64B", 64), ("large_1MB", 1 << 20)):
            for shape in ("http", "tunnel", "inject"):
                for how in ("direct", "proxy"):
                    if shape == "inject" and how == "direct":
                        continue
                    tp[f"{label}_{shape}_{how}"] = await throughput(
                        client, how, shape, size, args.clients, args.seconds
                    )
        result["throughput"] = tp
        r = await py(sbx, IN_SANDBOX.replace("N)", f"{min(args.n, 100)})"))
        plain, tunnel, inject = (float(x) for x in r.text.split())
        result["in_sandbox_median_ms"] = {
            "http": plain,
            "tunnel": tunnel,
            "inject": inject,
            "client": "python urllib, new connection each",
        }
        rt.kill(sbx.id)
    finally:
        for info in rt.list():
            rt.kill(info.id)
        cgroups.remove_parent(settings.cgroup_group)
        net.close()
        shutil.rmtree(tmp, ignore_errors=True)
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    asyncio.run(main())
