"""The runtime on a cgroup-v2-only stock kernel: run inside the guest by test_cgroup_v2.py
(``pytest tests/guest/v2_runtime.py`` there; on a v1 host every test here is skipped). A few
focused tests that prove the v2 backend: a guest under TCG is ~20-50 times slower than the host,
so nothing here asserts a time."""

from __future__ import annotations

import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from sandhold.runtime import cgroup_parent, cgroup_v2, cgroups
from tests.runtime.helpers import sh, state_from_another_pid_namespace
from tests.support.e2b_server import new_server

pytestmark = pytest.mark.skipif(cgroups.kind() != "v2", reason="runs in the cgroup v2 guest")


async def test_a_sandbox_lives_in_a_v2_group_with_its_limits(make_sandbox, runtime):
    sbx = await make_sandbox(limits={"memory_mb": 200, "cpu": 0.5, "pids": 80})
    cg = runtime.cgroup(sbx.id)
    d = cgroup_v2.root() / runtime.host.cgroup_group / sbx.id
    assert cg.dirs() == [d] and d.is_dir()
    assert (d / "memory.max").read_text().strip() == str(200 << 20)
    assert (d / "memory.swap.max").read_text().strip() == "0"
    assert (d / "cpu.max").read_text().split() == ["50000", "100000"]
    assert (d / "pids.max").read_text().strip() == "80"
    r = await sh(sbx, "cat /proc/self/cgroup; id -u")
    assert r.text.split() == ["0::/", "1000"]  # its own cgroup namespace, the sandbox user
    assert sbx.init_pid in cg.pids()
    usage = runtime.usage(sbx.id)
    assert usage.pids >= 1 and usage.memory_limit_bytes == 200 << 20 and usage.cpu_seconds > 0


async def test_pause_freezes_and_resume_thaws(make_sandbox, runtime):
    sbx = await make_sandbox()
    await sh(sbx, "nohup sh -c 'while :; do date +%s%N > /tmp/tick; sleep 0.05; done' &")
    runtime.pause(sbx.id)
    d = runtime.cgroup(sbx.id).dirs()[0]
    assert "frozen 1" in (d / "cgroup.events").read_text().splitlines()
    runtime.resume(sbx.id)
    assert "frozen 0" in (d / "cgroup.events").read_text().splitlines()
    assert (await sh(sbx, "echo back")).text.strip() == "back"


async def test_an_oom_stays_inside_and_the_agent_survives(make_sandbox, runtime):
    hog = await make_sandbox(limits={"memory_mb": 96})
    r = await sh(hog, "python3 -c 'x = []\nwhile True: x.append(bytearray(8 << 20))'; echo rc=$?")
    assert "rc=137" in r.text
    assert runtime.usage(hog.id).oom_kills >= 1
    assert (await sh(hog, "echo still here")).text.strip() == "still here"


async def test_a_fork_bomb_is_held_by_pids_max_and_killed_whole(make_sandbox, runtime):
    bomb = await make_sandbox(limits={"pids": 48})
    await sh(bomb, "(b(){ b|b& }; b) >/dev/null 2>&1 & sleep 2; echo launched", timeout=60)
    cg = runtime.cgroup(bomb.id)
    assert cg.usage()["pids"] <= 48
    runtime.kill(bomb.id)
    assert not cg.exists()


def test_a_server_in_a_group_below_the_root_writes_only_inside_it():
    """A server some supervisor other than systemd started in a group of its own below the
    root (under systemd: under_systemd.py). It moves its processes to a leaf, enables its
    controllers there and makes its sandboxes below; nothing outside its group changes."""
    unit = cgroups.CGROUP_ROOT / "sandhold-test.service"
    unit.mkdir()
    (cgroups.CGROUP_ROOT / "cgroup.subtree_control").write_text("+memory +pids +cpu")
    before = sorted(p.name for p in cgroups.CGROUP_ROOT.iterdir() if p.is_dir())
    data_dir = Path(tempfile.mkdtemp(prefix="sandhold-unit-", dir="/var/tmp"))  # traversable
    script = textwrap.dedent(f"""
        import asyncio, os
        from pathlib import Path
        Path("{unit}/cgroup.procs").write_text(str(os.getpid()))  # started in the unit
        from sandhold.config import Settings
        from sandhold.runtime.runtime import Runtime
        rt = Runtime(Settings(data_dir=Path("{data_dir}"))).open()
        info = rt.create({{}})
        print(Path("/proc/self/cgroup").read_text().strip())
        print(rt.cgroup(info.id).dirs()[0])
        rt.kill(info.id)
    """)
    try:
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           timeout=600)  # fmt: skip
        assert r.returncode == 0, r.stderr
        out = r.stdout.split()
        assert out[0] == f"0::/{unit.name}/{cgroup_v2.SERVER_LEAF}"
        assert Path(out[1]).is_relative_to(unit)
        assert "memory" in (unit / "cgroup.subtree_control").read_text().split()
        after = sorted(p.name for p in cgroups.CGROUP_ROOT.iterdir() if p.is_dir())
        assert after == before
    finally:
        remove_groups(unit)
        shutil.rmtree(data_dir, ignore_errors=True)


def test_a_server_in_a_pid_namespace_never_signals_what_it_cannot_see(runtime):
    """In a PID namespace (a pod's), v2 lists the tasks it cannot see as pid 0. The kill there
    goes through cgroup.kill and never signals a pid read from a cgroup file: os.kill(0) would
    kill the server's own process group."""
    group = runtime.cgroup("nsprobe")
    group.create(64, 0.1, 16)
    outside = subprocess.Popen(["sleep", "120"])
    try:
        group.add(outside.pid)
        probe = textwrap.dedent(f"""
            from sandhold.runtime import cgroups
            from sandhold.runtime.reconcile import cgroup_pids
            g = cgroups.group("nsprobe", "{runtime.host.cgroup_group}")
            print(open("{group.dirs()[0]}/cgroup.procs").read().split(), g.pids(),
                  sorted(cgroup_pids(g.dirs())), flush=True)
            g.kill_all()
            print("alive", flush=True)
        """)
        r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
                            probe], capture_output=True, text=True, timeout=600)  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == ["['0'] [] []", "alive"]
        assert outside.wait(60) == -signal.SIGKILL  # killed by cgroup.kill, not by a pid
    finally:
        outside.kill()
        outside.wait()
        group.remove()


def test_the_official_sdk_on_a_cgroup_v2_host(tmp_path):
    """A short tour through the official e2b SDK against `sandhold serve` on this kernel:
    create, run, files, pause (frozen in cgroup v2), resume through connect, kill."""
    from e2b import Sandbox, SandboxState

    srv = new_server(tmp_path)
    srv.start()
    try:
        sbx = Sandbox.create(timeout=600, **srv.sdk())
        assert sbx.commands.run("cat /proc/self/cgroup").stdout.strip() == "0::/"
        sbx.files.write("/home/user/kept.txt", "kept")
        assert sbx.pause() is True
        assert sbx.get_info().state == SandboxState.PAUSED
        record = srv.runtime().get(sbx.sandbox_id)
        assert srv.runtime().cgroup(record.id).frozen()
        back = Sandbox.connect(sbx.sandbox_id, timeout=600, **srv.sdk())
        assert back.files.read("/home/user/kept.txt") == "kept"
        assert back.commands.run("echo back").stdout.strip() == "back"
        assert back.kill() is True
        assert not srv.runtime().cgroup(record.id).exists()
    finally:
        srv.destroy()


async def test_a_read_from_another_pid_namespace_changes_nothing(make_sandbox, runtime):
    """v2's own signal: the group is judged by ``populated`` in cgroup.events from a namespace
    whose pids are not the record's."""
    sbx = await make_sandbox()
    assert state_from_another_pid_namespace(runtime, sbx.id, timeout=600) == "running"
    assert runtime.get(sbx.id).state == "running"


def test_a_server_in_a_private_cgroup_namespace_manages_its_own_group():
    """The container shape (a privileged pod with a private cgroup namespace): the server's own
    group shows as ``/``, and it is a group below the host's root, so the server moves itself to
    a leaf first; its sandboxes land in the pod's group, seen from the host."""
    pod = cgroups.CGROUP_ROOT / "sandhold-test-pod"
    pod.mkdir()
    (cgroups.CGROUP_ROOT / "cgroup.subtree_control").write_text("+memory +pids +cpu")
    data_dir = Path(tempfile.mkdtemp(prefix="sandhold-pod-", dir="/var/tmp"))
    script = textwrap.dedent(f"""
        from pathlib import Path
        from sandhold.config import Settings
        from sandhold.runtime.runtime import Runtime
        print(Path("/proc/self/cgroup").read_text().strip())
        rt = Runtime(Settings(data_dir=Path("{data_dir}"))).open()
        info = rt.create({{}})
        print(Path("/proc/self/cgroup").read_text().strip())
        print(rt.cgroup(info.id).dirs()[0], info.id)
        rt.kill(info.id)
    """)
    remount = "umount -l /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup"
    inner = f"{remount} && exec {sys.executable} -c {shlex.quote(script)}"
    outer = (f"echo $$ > {pod}/cgroup.procs && exec unshare --cgroup --mount "
             f"--propagation private sh -c {shlex.quote(inner)}")  # fmt: skip
    try:
        r = subprocess.run(["sh", "-c", outer], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        before, after, seen = r.stdout.splitlines()
        assert before == "0::/"  # its own group is the root it sees
        assert after == f"0::/{cgroup_v2.SERVER_LEAF}"
        inside, sandbox_id = seen.split()
        assert inside == f"/sys/fs/cgroup/{runtime_group(data_dir)}/{sandbox_id}"
        assert (pod / cgroup_v2.SERVER_LEAF).is_dir()  # the host sees it all below the pod
        assert "memory" in (pod / "cgroup.subtree_control").read_text().split()
    finally:
        remove_groups(pod)
        shutil.rmtree(data_dir, ignore_errors=True)


def runtime_group(data_dir: Path) -> str:
    from sandhold.config import Settings

    return cgroup_parent.name(Settings(data_dir=data_dir))


def remove_groups(top: Path) -> None:
    """A test's cgroup tree, emptied: its groups removed, the deepest first."""
    for d in sorted(top.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if d.is_dir():
            d.rmdir()
    top.rmdir()


def test_doctor_names_the_v2_backend_and_passes(runtime):
    from sandhold.runtime.doctor import run_checks

    s = runtime.settings
    checks = {c.name: c for c in run_checks(s.uid_base, s.uid_ranges, s.criu_path)}
    assert checks["cgroup backend"].detail.startswith("v2: ")
    assert str(cgroup_v2.root()) in checks["cgroup backend"].detail
    failed = [c for c in checks.values() if not c.ok and c.name != "KVM"]  # TCG: no /dev/kvm
    assert not failed, failed
