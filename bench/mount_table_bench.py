"""Whether the host's mount table slows creates: create → first command result straight on the
runtime (no server), with the host's table as it is, then with ``--mounts`` extra tmpfs mounts
added on the host (what ~``--mounts``/3 live sandboxes leave there), then without them again.

    .venv/bin/python bench/mount_table_bench.py [--mounts 3000] [--n 15]

A new sandbox's mount namespace is a copy of the host's (bwrap unshares, then pivots into its
root and detaches the rest), so its cost grows with the table. Each sandbox adds three mounts
to the host's (its layer, its root, its view); growth_bench.py saw creates 4 times slower at 1,000
sandboxes. The extra mounts are 4 KiB tmpfs under a temporary directory, removed at the end.
Writes bench/results/mount_table.json. Times are milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import tempfile
import time
from pathlib import Path

from benchstats import destroy_data_dir, summary, write_result
from sandhold.config import Settings
from sandhold.runtime.client import AgentClient
from sandhold.runtime.runtime import Runtime
from sandhold.runtime.spec import SandboxSpec


async def create_to_first_result(rt: Runtime) -> float:
    t = time.perf_counter()
    info = await asyncio.to_thread(rt.create, SandboxSpec(template="base"))
    async with AgentClient(info.agent_socket) as c:
        await c.sh("true")
    elapsed = (time.perf_counter() - t) * 1000
    await asyncio.to_thread(rt.kill, info.id)
    return elapsed


def host_mounts() -> int:
    return len(Path("/proc/self/mountinfo").read_text().splitlines())


async def main() -> dict[str, object]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mounts", type=int, default=3000, help="extra host mounts")
    ap.add_argument("--n", type=int, default=15, help="creates per phase")
    ap.add_argument("--out", default="bench/results/mount_table.json")
    args = ap.parse_args()
    data = Path(tempfile.mkdtemp(prefix="sandhold-mount-bench-", dir="/var/tmp"))
    extra = Path(tempfile.mkdtemp(prefix="sandhold-mount-bench-extra-", dir="/var/tmp"))
    rt = Runtime(Settings(data_dir=data))
    rt.open()
    phases: list[dict[str, object]] = []
    made: list[Path] = []

    async def phase(name: str) -> None:
        samples = [await create_to_first_result(rt) for _ in range(args.n)]
        phases.append({"phase": name, "host_mounts": host_mounts(),
                       "loadavg_1m": round(os.getloadavg()[0], 2),
                       "create_to_first_result_ms": summary(samples)})  # fmt: skip

    try:
        await create_to_first_result(rt)  # warm-up: the template, the agent's library
        await phase("as is")
        for i in range(args.mounts):
            (extra / str(i)).mkdir()
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "none", str(extra / str(i))],
                           check=True)  # fmt: skip
            made.append(extra / str(i))
        await phase(f"+{args.mounts} mounts")
    finally:
        for d in made:
            subprocess.run(["umount", str(d)], check=False)
        subprocess.run(["rm", "-rf", "--one-file-system", str(extra)], check=False)
    try:
        await phase("as is again")
    finally:
        destroy_data_dir(data)
    p50 = [float(ph["create_to_first_result_ms"]["p50"]) for ph in phases]  # type: ignore[index]
    result = {"phases": phases, "with_over_without_p50": round(p50[1] / ((p50[0] + p50[2]) / 2), 2)}
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    asyncio.run(main())
