"""``memory_merge`` (runtime/ksm.py): with it, the pages two sandboxes hold alike are merged by
the kernel. Run in a child process (the flag sticks to the process that sets it) over the test
data dir; the host's KSM settings are put back afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandhold.runtime.ksm import KSM

pytestmark = pytest.mark.skipif(not (KSM / "run").exists(), reason="no KSM in this kernel")

SCRIPT = r"""
import json, sys, time
from pathlib import Path
from sandhold.config import Settings
from sandhold.runtime.runtime import Runtime
from tests.runtime.helpers import sh_sync

rt = Runtime(Settings(data_dir=Path(sys.argv[1]), memory_merge=True,
                      memory_merge_pages_to_scan=20000)).open()
made = [rt.create({"template": "base"}) for _ in range(2)]
try:
    hold = "python3 -c 'import time; b = bytearray(b\"sandhold\" * (2 << 20)); time.sleep(120)'"
    for info in made:
        sh_sync(info, f"nohup {hold} >/dev/null 2>&1 &")
    merging, flags, deadline = {}, {}, time.monotonic() + 60
    while time.monotonic() < deadline:
        for info in made:
            for pid in rt.cgroup(info.id).pids():
                stat = Path(f"/proc/{pid}/ksm_stat").read_text()
                flags[pid] = "ksm_merge_any: yes" in stat
                merging[pid] = int(Path(f"/proc/{pid}/ksm_merging_pages").read_text())
        merged = [i for i in made if any(merging[p] > 1000 for p in rt.cgroup(i.id).pids())]
        if len(merged) == 2:
            break
        time.sleep(0.5)
    print(json.dumps({"flags": list(flags.values()), "merging": list(merging.values())}))
finally:
    for info in made:
        rt.kill(info.id)
"""


@pytest.fixture
def ksm_restored() -> Iterator[None]:
    names = ("run", "pages_to_scan", "sleep_millisecs")
    saved = {n: (KSM / n).read_text().strip() for n in names}
    yield
    (KSM / "run").write_text("2")  # unmerge what was merged
    for n in names:
        (KSM / n).write_text(saved[n])


def test_pages_alike_in_two_sandboxes_are_merged(data_dir: Path, ksm_restored: None) -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(data_dir)],
        capture_output=True, text=True, timeout=180, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["flags"] and all(result["flags"])  # every sandbox process is mergeable
    assert sum(1 for m in result["merging"] if m > 1000) >= 2, result  # 16 MiB alike: merged
