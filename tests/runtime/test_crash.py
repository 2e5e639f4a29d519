"""Crashes in the middle of creates and kills: whatever a SIGKILL interrupts, reconcile leaves
nothing behind but working, listed sandboxes, and never disturbs a create still in flight.

No timing asserts: each test waits (bounded) for the state cleanup must reach."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

import pytest
from e2b import Sandbox

from sandhold.config import Settings
from sandhold.runtime import cgroup_parent, cgroups, mounts
from sandhold.runtime.runtime import Runtime
from tests.runtime.helpers import sh
from tests.support.e2b_server import KEY_A, Server, new_server

# -- what a data dir leaves on the host ---------------------------------------------------------


def _cgroup_names(group: str) -> set[str]:
    """Groups under ``group`` in every hierarchy the backend uses (v1 controllers and v2)."""
    names = set()
    for parent in cgroups.group_dirs(group, ""):
        if parent.is_dir():
            names |= {p.name for p in parent.iterdir() if p.is_dir()}
    return names


def _owner(data_dir: Path, group: str, cgroup: str, argv: list[str]) -> str | None:
    """The sandbox a process belongs to: the group it is in, or a path of the sandbox in its
    command line (a bwrap, or the shell that starts one before it joins the groups)."""
    for line in cgroup.splitlines():
        path = line.split(":", 2)[-1]
        if f"/{group}/" in path:
            return path.split(f"/{group}/", 1)[1].split("/")[0]
    needles = (f"{data_dir}/sandboxes/", f"/{group}/")
    for arg in argv:
        for needle in needles:
            if needle in arg:
                return arg.split(needle, 1)[1].split("/")[0]
    return None


def sandbox_processes(data_dir: Path) -> dict[int, str]:
    """Live processes of the data dir's sandboxes, pid -> owner and command. Zombies are not
    counted: they hold nothing but a pid, and whoever adopted them reaps them."""
    group = cgroup_parent.name(Settings(data_dir=data_dir))
    out = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if (p / "stat").read_text().rpartition(")")[2].split()[0] == "Z":
                continue
            argv = (p / "cmdline").read_bytes().decode(errors="replace").split("\0")
            owner = _owner(data_dir, group, (p / "cgroup").read_text(), argv)
        except OSError:
            continue
        if owner is not None:
            out[int(p.name)] = f"{owner}: {' '.join(argv)[:120]}"
    return out


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def leftovers(data_dir: Path, keep: Collection[str] = ()) -> dict[str, list[str]]:
    """Everything on the host that belongs to a sandbox of ``data_dir`` not in ``keep``."""
    group = cgroup_parent.name(Settings(data_dir=data_dir))
    sdir = data_dir / "sandboxes"
    kept = tuple(f"{sdir}/{k}/" for k in keep)
    found = {
        "dirs": sorted(p.name for p in sdir.iterdir() if p.name not in keep),
        "cgroups": sorted(_cgroup_names(group) - set(keep)),
        "mounts": [m for m in mounts.mounts_under(data_dir) if not m.startswith(kept)],
        "processes": [v for v in sandbox_processes(data_dir).values()
                      if v.split(":")[0] not in keep],
        "loop devices": [f"{b.parent.parent.name}: {f}" for b in Path("/sys/block").glob(
                         "loop*/loop/backing_file") if (f := _read(b)).startswith(f"{sdir}/")
                         and not f.startswith(kept)],
    }  # fmt: skip
    return {k: v for k, v in found.items() if v}


def eventually_clean(
    data_dir: Path, keep: Callable[[], Collection[str]] = tuple, within: float = 60
) -> None:
    deadline = time.monotonic() + within
    while left := leftovers(data_dir, keep()):
        if time.monotonic() > deadline:
            raise AssertionError(f"still there after {within} s: {left}")
        time.sleep(0.25)


# -- a runtime of its own, and processes that die in the middle of a create ---------------------


@pytest.fixture
def crash_rt() -> Iterator[Runtime]:
    d = Path(tempfile.mkdtemp(prefix="sandhold-crash-", dir="/var/tmp"))
    d.chmod(0o755)
    rt = Runtime(Settings(data_dir=d)).open()
    rt.templates.get("base")
    rt.agent_lib()
    yield rt
    try:
        rt.reconcile()
        for info in rt.list():
            rt.kill(info.id)
    finally:
        for target in mounts.mounts_under(d):
            mounts.umount(Path(target))
        cgroups.remove_parent(rt.host.cgroup_group)
        shutil.rmtree(d, ignore_errors=True)


# One create then one kill, in a process of its own, printing where it got to.
CREATOR = """
import os, sys
from sandhold.config import Settings
from sandhold.runtime.runtime import Runtime
rt = Runtime(Settings(data_dir=os.environ["CRASH_DATA_DIR"]))  # not opened: no reconcile
def say(word):
    sys.stdout.write(word + "\\n")
    sys.stdout.flush()
say("go")
info = rt.create({"workspace_id": "crash"})
say("created")
rt.kill(info.id)
say("killed")
"""


def _child_env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_")}
    env["CRASH_DATA_DIR"] = str(data_dir)
    return env


def start_creator(data_dir: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CREATOR], env=_child_env(data_dir), stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "go\n"
    return proc


def creator_duration(data_dir: Path) -> float:
    """Seconds from "go" to "killed" of an undisturbed creator."""
    proc = start_creator(data_dir)
    t = time.monotonic()
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out == "created\nkilled\n", out
    return time.monotonic() - t


def crash_creator(data_dir: Path, delay: float) -> str:
    """Start a creator, SIGKILL it ``delay`` seconds after it starts creating; returns how far
    it got."""
    proc = start_creator(data_dir)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=60)
    return out.split()[-1] if out.split() else "go"


# -- (c) crash points inside create and kill ----------------------------------------------------

CRASHES = 30


def test_every_crash_point_of_create_and_kill_is_cleaned_by_one_reconcile(crash_rt):
    d = crash_rt.settings.data_dir
    span = creator_duration(d)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    reached: dict[str, int] = {}  # how far the creator got: what it left
    for i in range(CRASHES):
        # A third of the crashes in the first 40 ms: claiming the directory, cgroups, overlay.
        delay = rng.uniform(0, 0.04) if i % 3 == 0 else rng.uniform(0, span)
        got = crash_creator(d, delay)
        left = leftovers(d)
        records = [f.name for f in (d / "sandboxes").glob("*/*.json") if f.name != "agent.json"]
        seen = f"{got}: {'+'.join([*left, *records]) or 'nothing'}"  # what reconcile met
        reached[seen] = reached.get(seen, 0) + 1
        crash_rt.reconcile()
        live = {info.id for info in crash_rt.list()}  # a create that finished is a sandbox
        assert len(live) <= 1
        left = leftovers(d, live)
        assert not left, f"crash {i} (seed {seed}, {delay:.3f} s, reached {got!r}): {left}"
        for sid in live:
            crash_rt.kill(sid)
        assert not leftovers(d), f"crash {i} (seed {seed}): kill left debris"
    print(f"crash points (seed {seed}):", *sorted(reached.items()), sep="\n  ")


# -- (b) a reconcile running alongside creates --------------------------------------------------

HAMMER = """
import os, sys
from sandhold.config import Settings
from sandhold.runtime.runtime import Runtime
rt = Runtime(Settings(data_dir=os.environ["CRASH_DATA_DIR"])).open()
sys.stdout.write("go\\n")
sys.stdout.flush()
n = 0
while not os.path.exists(os.environ["CRASH_DATA_DIR"] + "/stop"):
    rt.reconcile()
    n += 1
print(n)
"""


@pytest.mark.parametrize("where", ["another process", "this process"])
def test_reconcile_alongside_creates_cleans_debris_and_leaves_creates_alone(crash_rt, where):
    d = crash_rt.settings.data_dir
    stop = threading.Event()
    runs = [0]
    hammer: subprocess.Popen[str] | None = None
    if where == "another process":
        hammer = subprocess.Popen(
            [sys.executable, "-c", HAMMER], env=_child_env(d), stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        assert hammer.stdout is not None and hammer.stdout.readline() == "go\n"
    else:

        def loop() -> None:
            while not stop.is_set():
                crash_rt.reconcile()  # the same Runtime the creates run on, as in the server
                runs[0] += 1

        threading.Thread(target=loop, daemon=True).start()

    errors: list[str] = []
    made = [0]

    def creates() -> None:
        for _ in range(8):
            try:
                info = crash_rt.create({"workspace_id": "alongside"})
                out = asyncio.run(sh(info, "echo ok")).text.strip()
                if out != "ok":
                    errors.append(f"{info.id} answered {out!r}")
                crash_rt.kill(info.id)
                made[0] += 1
            except Exception as e:  # every create must succeed: collect, assert below
                errors.append(repr(e))

    workers = [threading.Thread(target=creates) for _ in range(3)]
    for w in workers:
        w.start()
    span = creator_duration(d)
    rng = random.Random()
    for _ in range(6):  # debris for the reconcile to clean while the creates run
        crash_creator(d, rng.uniform(0, span))
    for w in workers:
        w.join()
    try:
        assert not errors, errors
        assert made[0] == 24
        # A creator killed between its create's end and its kill's start left a sandbox, not
        # debris (as in the crash points' test): it is killed as any live one; the rest is the
        # reconcile's.
        for info in crash_rt.list():
            if info.spec.workspace_id == "crash":
                crash_rt.kill(info.id)
        eventually_clean(d, within=30)  # cleaned by the reconcile running alongside
    finally:
        stop.set()
        if hammer is not None:
            (d / "stop").touch()
            out, _ = hammer.communicate(timeout=60)
            runs[0] = int(out.strip() or 0)
            (d / "stop").unlink()
    assert runs[0] > 10, "the reconcile hardly ran"


# -- (a) `sandhold serve` killed while clients create -------------------------------------------


def _creates_then_crash(srv: Server) -> None:
    """Six clients creating in a loop; SIGKILL of the server with creates in flight; restart."""
    created: list[str] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            try:
                created.append(Sandbox.create(timeout=300).sandbox_id)
            except Exception:  # the server died under the request
                time.sleep(0.05)

    clients = [threading.Thread(target=client) for _ in range(6)]
    for c in clients:
        c.start()
    deadline = time.monotonic() + 60
    while len(created) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(random.uniform(0, 0.2))
    assert srv.proc is not None
    srv.proc.kill()
    srv.proc.wait()
    stop.set()
    srv.start()  # requests waiting in the listening socket's backlog go to it
    for c in clients:
        c.join()


def test_server_killed_during_creates_leaves_only_working_sandboxes(tmp_path, monkeypatch):
    srv = new_server(tmp_path, reconcile_interval_s="1")
    for k, v in {"E2B_API_URL": srv.url, "E2B_SANDBOX_URL": srv.url, "E2B_API_KEY": KEY_A,
                 "NO_PROXY": "127.0.0.1,localhost"}.items():  # fmt: skip
        monkeypatch.setenv(k, v)
    srv.start()

    def listed() -> set[str]:
        with srv.api() as api:
            return {s["sandboxID"] for s in api.get("/sandboxes").json()}

    try:
        for _ in range(2):
            _creates_then_crash(srv)
            eventually_clean(srv.data_dir, keep=listed)
            for sid in listed():
                sbx = Sandbox.connect(sid)
                assert sbx.commands.run("echo ok").stdout.strip() == "ok"
                sbx.kill()
            assert not leftovers(srv.data_dir)
    finally:
        srv.destroy()
