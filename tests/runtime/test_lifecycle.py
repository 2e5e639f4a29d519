"""Create, pause, resume, kill, re-attach: the lifecycle of real sandboxes."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from sandhold.errors import Conflict, InvalidRequest, SandboxNotFound, TemplateNotFound
from sandhold.runtime import cgroups, reaping
from sandhold.runtime.runtime import Runtime
from tests.runtime.helpers import sh, state_from_another_pid_namespace


def _cpu_ns(runtime: Runtime, sid: str) -> int:
    return cgroups.group(sid, runtime.host.cgroup_group).usage()["cpu_ns"]


async def test_pause_stops_cpu_and_resume_continues_the_same_process(make_sandbox, runtime):
    sbx = await make_sandbox()
    await sh(sbx, "(i=0; while true; do i=$((i+1)); echo $i > /tmp/c; mv /tmp/c /tmp/count; done)"
                  " >/dev/null 2>&1 & echo $! > /tmp/pid")  # fmt: skip
    await asyncio.sleep(0.3)
    pid_before = (await sh(sbx, "cat /tmp/pid")).text.strip()
    runtime.pause(sbx.id)
    assert runtime.get(sbx.id).state == "paused"
    cpu0 = _cpu_ns(runtime, sbx.id)
    await asyncio.sleep(0.5)
    assert _cpu_ns(runtime, sbx.id) == cpu0, "a paused sandbox used CPU"
    with pytest.raises(Conflict):
        runtime.pause(sbx.id)
    runtime.resume(sbx.id)
    count1 = int((await sh(sbx, "cat /tmp/count")).text)
    await asyncio.sleep(0.3)
    count2 = int((await sh(sbx, "cat /tmp/count")).text)
    assert count2 > count1 > 0
    r = await sh(sbx, f"kill -0 {pid_before} && echo alive")
    assert r.text.strip() == "alive"
    with pytest.raises(Conflict):
        runtime.resume(sbx.id)


async def test_memory_survives_pause(make_sandbox, runtime):
    sbx = await make_sandbox()
    await sh(sbx, "python3 -c 'import time; x = bytearray(b\"s\" * (50 << 20)); time.sleep(600)' &"
                  " sleep 0.5")  # fmt: skip
    before = runtime.usage(sbx.id).memory_bytes
    runtime.pause(sbx.id)
    await asyncio.sleep(0.2)
    assert runtime.usage(sbx.id).memory_bytes >= before * 0.9
    runtime.resume(sbx.id)
    r = await sh(sbx, "pgrep -fc bytearray")
    assert r.text.strip() == "1"


async def test_workspace_outlives_the_sandbox(make_sandbox, runtime):
    first = await make_sandbox(workspace_id="persist")
    await sh(first, "echo kept > /workspace/notes.txt; mkdir -p /workspace/sub; "
                    "echo x > /workspace/sub/f; echo lost > /home/user/scratch")  # fmt: skip
    runtime.kill(first.id)
    second = await make_sandbox(workspace_id="persist")
    r = await sh(second, "cat /workspace/notes.txt /workspace/sub/f; cat /home/user/scratch")
    assert r.text.split("\n")[:2] == ["kept", "x"]
    assert "lost" not in r.text  # the writable layer went with the first sandbox
    r = await sh(second, "echo more >> /workspace/notes.txt && echo ok")
    assert r.text.strip() == "ok"


async def test_kill_removes_everything(make_sandbox, runtime):
    sbx = await make_sandbox(workspace_id="killme")
    await sh(sbx, "sleep 1000 & sleep 1000 & echo started")
    cg = cgroups.group(sbx.id, runtime.host.cgroup_group)
    pids = cg.pids()
    assert len(pids) >= 4
    runtime.kill(sbx.id)
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}"), f"process {pid} survived kill"
    assert not any(d.exists() for d in cg.dirs())
    assert not sbx.dir.exists()
    with open("/proc/self/mountinfo") as f:
        assert sbx.id not in f.read()
    assert runtime.workspace_path("killme").is_dir()
    with pytest.raises(SandboxNotFound):
        runtime.get(sbx.id)
    with pytest.raises(SandboxNotFound):
        runtime.kill(sbx.id)


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ({"template": "no-such-template"}, TemplateNotFound),
        ({"template": "../etc"}, InvalidRequest),
        ({"limits": {"memory_mb": 1}}, InvalidRequest),
        ({"limits": {"memory_mb": 10**9}}, InvalidRequest),
        ({"limits": {"cpu": 0}}, InvalidRequest),
        ({"limits": {"cpu": 512}}, InvalidRequest),
        ({"limits": {"pids": 2}}, InvalidRequest),
        ({"workspace_id": "../../etc"}, InvalidRequest),
        ({"mounts": [{"source": "/etc", "target": "/proc/x"}]}, InvalidRequest),
        ({"mounts": [{"source": "/etc", "target": "data/../.."}]}, InvalidRequest),
        ({"mounts": [{"source": "/nonexistent", "target": "/data"}]}, InvalidRequest),
        ({"env": {"BAD NAME": "x"}}, InvalidRequest),
        ({"user": "admin"}, InvalidRequest),
        ({"network": {"mode": "bridge"}}, InvalidRequest),
        ({"unknown_field": 1}, InvalidRequest),
    ],
)
async def test_bad_input_is_rejected_and_leaves_nothing(runtime, spec, error):
    before = sorted(p.name for p in runtime.sandboxes_dir.iterdir())
    with pytest.raises(error) as exc:
        runtime.create(spec)
    assert exc.value.message  # a human-readable reason
    assert sorted(p.name for p in runtime.sandboxes_dir.iterdir()) == before


async def test_failed_start_leaves_nothing(runtime, monkeypatch):
    """An agent that never becomes ready: create fails and undoes every step it had done."""
    monkeypatch.setattr(runtime.settings, "ready_timeout_s", 0.5)
    from sandhold.runtime import launcher

    monkeypatch.setattr(launcher, "AGENT_MAIN", "/bin/sleep")  # not the agent: never ready
    before = sorted(p.name for p in runtime.sandboxes_dir.iterdir())
    with pytest.raises(Exception, match=r"not ready|failed"):
        runtime.create({})
    assert sorted(p.name for p in runtime.sandboxes_dir.iterdir()) == before
    from sandhold.runtime import cgroups

    known = {p.name for p in runtime.sandboxes_dir.iterdir()}
    assert set(cgroups.list_names(runtime.host.cgroup_group)) <= known


async def test_sandboxes_survive_the_process_that_created_them(runtime, settings):
    """Create from a separate process that then exits; a fresh Runtime re-attaches."""
    env = {**os.environ, "SANDHOLD_DATA_DIR": str(settings.data_dir)}
    out = subprocess.run(
        [sys.executable, "-m", "sandhold.cli", "sandbox", "create", "--workspace", "reattach"],
        capture_output=True, text=True, env=env, check=True,
    ).stdout  # fmt: skip
    sid = out.strip().split()[-1]
    subprocess.run([sys.executable, "-m", "sandhold.cli", "sandbox", "pause", sid],
                   env=env, check=True, capture_output=True)  # fmt: skip
    fresh = Runtime(settings).open()
    try:
        info = fresh.get(sid)
        assert info.state == "paused"
        fresh.resume(sid)
        r = await sh(info, "echo alive; ls /workspace >/dev/null && echo ws")
        assert r.text.split() == ["alive", "ws"]
    finally:
        fresh.kill(sid)


async def test_parallel_creates(make_sandbox):
    boxes = await asyncio.gather(*(make_sandbox() for _ in range(8)))
    assert len({b.id for b in boxes}) == 8
    results = await asyncio.gather(*(sh(b, "hostname; id -un") for b in boxes))
    assert all(r.text.split() == ["sandbox", "user"] for r in results)


async def test_operator_mounts_appear_at_new_paths_read_only(make_sandbox, runtime, tmp_path):
    hidden = tmp_path / "skill"  # under pytest's 0700 tmp dir: unreachable for the sandbox
    hidden.mkdir()
    with pytest.raises(InvalidRequest, match="not searchable by others"):
        runtime.create({"mounts": [{"source": str(hidden), "target": "/skills/demo"}]})
    src = Path(tempfile.mkdtemp(dir="/var/tmp"))
    src.chmod(0o755)
    (src / "SKILL.md").write_text("how to\n")
    sbx = await make_sandbox(mounts=[{"source": str(src), "target": "/skills/demo"}])
    for user in ("user", "root"):  # a new mount point is visible to both, writable by neither
        r = await sh(sbx, "cat /skills/demo/SKILL.md; touch /skills/demo/x 2>&1; echo rc=$?",
                     user=user)  # fmt: skip
        assert r.text.startswith("how to\n") and "rc=1" in r.text, r.text

    assert sorted(p.name for p in src.iterdir()) == ["SKILL.md"]
    # The operator removes the directory while the sandbox runs: its record still loads.
    shutil.rmtree(src)
    assert runtime.get(sbx.id).spec.mounts[0].target == "/skills/demo"
    assert sbx.id in [i.id for i in runtime.list()]


async def test_peek_sees_only_a_running_sandbox_at_its_current_record(make_sandbox, runtime):
    """``peek`` (the data plane's lookup without a thread) answers as ``get`` for a running
    sandbox, and leaves every other case to ``get``: paused, unknown, invalid, a dead agent."""
    sbx = await make_sandbox()
    got = runtime.get(sbx.id)
    peeked = runtime.peek(sbx.id)
    assert peeked is not None and peeked.to_json() == got.to_json()
    runtime.pause(sbx.id)
    assert runtime.peek(sbx.id) is None
    runtime.resume(sbx.id)
    assert runtime.peek(sbx.id) is not None
    assert runtime.peek("nosuchsandbox") is None and runtime.peek("../etc") is None
    os.kill(got.init_pid, 9)
    for _ in range(200):
        if runtime.peek(sbx.id) is None:
            break
        await asyncio.sleep(0.01)
    assert runtime.peek(sbx.id) is None
    assert runtime.get(sbx.id).state == "failed"


def test_a_pid_1_ending_its_namespace_is_ending_until_it_is_gone(tmp_path):
    # A dying pid 1 waits in the kernel until the rest of its namespace has ended, still listed
    # in its cgroup, its socket closed: `ending` must see it. A frozen child keeps it there.
    freezer = Path("/sys/fs/cgroup/freezer") / f"sandhold-test-ending-{os.getpid()}"
    freezer.mkdir()
    ns = subprocess.Popen(["unshare", "--pid", "--fork", "sh", "-c", "sleep 600 & wait"])
    try:
        init = sleeper = None
        for _ in range(500):
            kids = Path(f"/proc/{ns.pid}/task/{ns.pid}/children").read_text().split()
            init = int(kids[0]) if kids else None
            grand = Path(f"/proc/{init}/task/{init}/children").read_text().split() if init else []
            if grand:
                sleeper = int(grand[0])
                break
            time.sleep(0.01)
        assert init and sleeper
        assert not reaping.ending(init)
        (freezer / "cgroup.procs").write_text(str(sleeper))
        (freezer / "freezer.state").write_text("FROZEN")
        os.kill(init, signal.SIGKILL)
        for _ in range(500):  # (it enters do_exit at once, and stays there: the sleeper is frozen)
            if reaping.ending(init):
                break
            time.sleep(0.01)
        assert reaping.ending(init) and Path(f"/proc/{init}").exists()
        (freezer / "freezer.state").write_text("THAWED")
        assert ns.wait(timeout=30) != 0
        assert reaping.ending(init)  # gone
    finally:
        (freezer / "freezer.state").write_text("THAWED")
        ns.kill()
        ns.wait()
        for _ in range(500):
            try:
                freezer.rmdir()
                break
            except OSError:
                time.sleep(0.01)


async def test_a_read_from_another_pid_namespace_leaves_a_sandbox_running(make_sandbox, runtime):
    """Seen from another PID namespace (`sandhold sandbox ls` outside a pod's, or inside one),
    the record's pids are not the reader's: the sandbox is judged by its group holding any
    process, and the read changes nothing. It marked every running sandbox failed before."""
    sbx = await make_sandbox()
    assert state_from_another_pid_namespace(runtime, sbx.id, timeout=120) == "running"
    assert runtime.get(sbx.id).state == "running"
    assert (await sh(sbx, "echo alive")).text.strip() == "alive"
