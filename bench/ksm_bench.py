"""What ``memory_merge`` (runtime/ksm.py) saves and costs: N idle ``code-interpreter-v1``
sandboxes (started warm, from one checkpoint) and N idle ``base`` sandboxes, their PSS per
sandbox before ksmd runs and after it has merged for ``--seconds``, and ksmd's CPU meanwhile.

    .venv/bin/python bench/ksm_bench.py [--n 6] [--seconds 60] [--pages 1000]

The host's KSM settings are put back afterwards (merged pages unmerged). Writes
bench/results/ksm.json.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import tempfile
import time
from pathlib import Path

from benchstats import destroy_data_dir, pss_kib, summary, write_result
from sandhold.config import Settings
from sandhold.interpreter.template import TEMPLATE_NAME, build_code_interpreter_template
from sandhold.runtime.ksm import KSM, PR_SET_MEMORY_MERGE, stats
from sandhold.runtime.runtime import Runtime

KNOBS = ("run", "pages_to_scan", "sleep_millisecs")


def ksmd_cpu_s() -> float:
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "ksmd":
                    f = Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()
                    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
            except OSError:
                continue
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--pages", type=int, default=1000)
    ap.add_argument("--cache", default="/var/tmp/sandhold-cache/interpreter")
    ap.add_argument("--out", default="bench/results/ksm.json")
    args = ap.parse_args()
    saved = {k: (KSM / k).read_text().strip() for k in KNOBS}
    data = Path(tempfile.mkdtemp(prefix="sandhold-ksm-bench-", dir="/var/tmp"))
    data.chmod(0o755)
    settings = Settings(data_dir=data)
    made: dict[str, list[str]] = {TEMPLATE_NAME: [], "base": []}
    result: dict[str, object] = {"n": args.n, "seconds": args.seconds, "pages_to_scan": args.pages,
                                 "loadavg_1m_at_start": round(os.getloadavg()[0], 2)}  # fmt: skip
    try:
        # What memory_merge does, with ksmd started only once "before" is measured: this
        # process, and so every sandbox it starts, mergeable.
        if ctypes.CDLL(None).prctl(PR_SET_MEMORY_MERGE, 1, 0, 0, 0) != 0:
            raise SystemExit("prctl(PR_SET_MEMORY_MERGE) failed")
        rt = Runtime(settings).open()
        build_code_interpreter_template(rt.templates, cache_dir=Path(args.cache))
        rt.warm.build(TEMPLATE_NAME)
        for template, ids in made.items():
            ids += [rt.create({"template": template}).id for _ in range(args.n)]
        time.sleep(3)

        def pss() -> dict[str, dict[str, float]]:
            return {t: summary([pss_kib(rt.cgroup(i).pids()) / 1024 for i in ids])
                    for t, ids in made.items()}  # fmt: skip

        result["pss_mib_before"] = pss()
        cpu0, t0 = ksmd_cpu_s(), time.monotonic()
        (KSM / "pages_to_scan").write_text(str(args.pages))
        (KSM / "sleep_millisecs").write_text("20")
        (KSM / "run").write_text("1")
        time.sleep(args.seconds)
        result["ksmd_cpu_share"] = round((ksmd_cpu_s() - cpu0) / (time.monotonic() - t0), 3)
        result["ksm"] = stats()
        result["pss_mib_after"] = pss()
    finally:
        (KSM / "run").write_text("2")
        for k in KNOBS:
            (KSM / k).write_text(saved[k])
        destroy_data_dir(data)
    write_result(args.out, result)


if __name__ == "__main__":
    main()
