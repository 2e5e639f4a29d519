"""Root inside a sandbox trying to destroy it: the commands a model runs to clean up its stuck
scripts (``kill -9 -1``, ``pkill -9 -f python``, ``pkill -f sandhold``), signals to pid 1 and to
the agent, making the agent the OOM killer's choice, starving it of resources. The sandbox must
still answer with everything outside /workspace in place. If the agent dies anyway (killed from
the host here), the sandbox is marked failed and kept until a kill removes it. And nothing of the
host's layout is visible inside."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import CommandExitException, NotFoundException, Sandbox, SandboxQuery, SandboxState

from sandhold.runtime import mounts
from sandhold.runtime.runtime import Runtime, SandboxInfo
from tests.runtime.helpers import sh
from tests.support.e2b_server import KEY_A, Server, new_server

# The agent's pid as root inside sees it (found by its command line, as a model would).
AGENT = "$(pgrep -o -f '^/usr/bin/python3 -I -S /opt/sandhold/lib/')"
KILLS = [
    "kill -9 -1",
    "pkill -9 -f python",
    "pkill -f sandhold",
    "kill -TERM 1",
    "kill -9 1",
    f"for s in INT HUP QUIT SEGV USR1 USR2 ALRM; do kill -$s {AGENT}; done",
    f"kill -TERM {AGENT}",
    f"kill -9 {AGENT}",
]


def agent_host_pid(runtime: Runtime, info: SandboxInfo) -> int:
    """The agent's host pid, found by its command line among the sandbox's processes (bwrap's,
    which names the agent too, does not start with python)."""
    for pid in runtime.cgroup(info.id).pids():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if argv[0] == b"/usr/bin/python3" and any(
                a.endswith(b"agent/__main__.py") for a in argv
            ):
                return pid
        except FileNotFoundError:
            pass
    raise AssertionError(f"no agent in sandbox {info.id}")


@pytest.mark.parametrize("attack", KILLS)
async def test_root_cannot_kill_the_sandbox(make_sandbox, runtime, attack):
    info = await make_sandbox()
    await sh(info, "echo kept > /home/user/outside; echo kept > /tmp/in-tmp")
    await sh(info, "(sleep 600 &)", user="root")  # root has no CAP_KILL: it kills only root's
    before = agent_host_pid(runtime, info)
    # The attack may well take its own shell with it (pkill -f sandhold matches it too).
    await sh(info, f"{attack}; echo done", user="root")
    await asyncio.sleep(0.2)  # a dying agent takes its sandbox along at once
    r = await sh(info, "cat /home/user/outside /tmp/in-tmp; echo alive", user="root")
    assert r.text.split() == ["kept", "kept", "alive"]
    assert runtime.get(info.id).state == "running"
    assert agent_host_pid(runtime, info) == before
    if attack == "kill -9 -1":  # the attack itself worked: the user's processes are gone
        assert (await sh(info, "pgrep -c -x sleep")).text.strip() == "0"


async def test_the_agent_is_init_and_handles_only_sigchld(make_sandbox, runtime):
    info = await make_sandbox()
    r = await sh(info, "tr '\\0' ' ' < /proc/1/cmdline; echo; grep -E '^Sig(Cgt|Ign)' "
                       "/proc/1/status; ls /proc/1/task", user="root")  # fmt: skip
    lines = r.text.splitlines()
    assert "sandhold/agent/__main__.py" in lines[0]
    masks = {k: int(v, 16) for k, v in (line.split() for line in lines[1:3])}
    sigs = {k: {s for s in range(1, 65) if m >> (s - 1) & 1} for k, m in masks.items()}
    # A handler makes a signal deliverable to init from inside: SIGCHLD only, which reaps.
    assert sigs["SigCgt:"] == {signal.SIGCHLD}
    # Ignored signals are dropped, from inside or not: Python's, and any the creator inherited
    # (e.g. glibc's reserved real-time ones, ignored in some test workers).
    assert {signal.SIGPIPE, signal.SIGXFSZ} <= sigs["SigIgn:"]
    assert lines[3:] == ["1"]  # one thread: /proc/1/task/1 is the only other way to its files
    # The runtime's init_pid is the sandbox's pid 1: the agent.
    assert agent_host_pid(runtime, info) == info.init_pid
    nspid = Path(f"/proc/{info.init_pid}/status").read_text().split("NSpid:")[1].split("\n")[0]
    assert nspid.split()[-1] == "1"


async def test_orphans_are_reaped_and_commands_keep_their_status(make_sandbox):
    info = await make_sandbox()
    r = await sh(info, "(sleep 30 &); sleep 0.2; ps -o ppid= -C sleep | sort -u; "
                       "tr '\\0' ' ' < /proc/1/cmdline")  # fmt: skip
    ppid, cmdline = r.text.split(None, 1)
    assert ppid == "1" and cmdline.startswith("/usr/bin/python3")  # orphans go to the agent
    # 300 double-forked processes that end at once, while other commands end with a status.
    storm = "for i in $(seq 300); do (sh -c 'exit 3' &); done; exit 7"
    results = await asyncio.gather(sh(info, storm), *(sh(info, f"exit {n}") for n in (4, 5, 6)))
    assert [res.exit_code for res in results] == [7, 4, 5, 6]
    await asyncio.sleep(0.5)
    r = await sh(info, "ps -eo stat= | grep -c '^Z'")
    assert r.text.strip() == "0", "zombies accumulate"


async def test_oom_kills_the_users_process_whatever_root_does(make_sandbox, runtime):
    info = await make_sandbox(limits={"memory_mb": 128})
    agent = agent_host_pid(runtime, info)
    score = Path(f"/proc/{agent}/oom_score_adj").read_text()
    attack = (
        f"a={AGENT}; for f in /proc/$a/oom_score_adj /proc/$a/task/$a/oom_score_adj; do "
        "echo 1000 > $f && echo RAISED; done; "
        "for f in /proc/$a/oom_adj /proc/$a/task/$a/oom_adj; do echo 15 > $f && echo RAISED; "
        "done; echo -1000 > /proc/self/oom_score_adj && echo PROTECTED; true"
    )
    r = await sh(info, f"({attack}) 2>&1", user="root")
    assert "RAISED" not in r.text and "PROTECTED" not in r.text, r.text
    assert "Read-only file system" in r.text and "Permission denied" in r.text
    assert Path(f"/proc/{agent}/oom_score_adj").read_text() == score
    assert score.strip() in ("0", "-1000")  # -1000 where the host has CAP_SYS_RESOURCE
    # The lowest a user process can go is the agent's floor; the hog is still the one killed.
    hog = "echo 0 > /proc/self/oom_score_adj; python3 -c 'b = b\"x\" * (300 << 20)'"
    r = await sh(info, f"{hog}; echo rc=$?", user="root")
    assert "rc=137" in r.text, r.text
    assert runtime.usage(info.id).oom_kills >= 1
    assert (await sh(info, "echo alive")).text.strip() == "alive"
    assert agent_host_pid(runtime, info) == agent


async def test_root_cannot_starve_the_agent_with_rlimits(make_sandbox, runtime):
    info = await make_sandbox()
    r = await sh(info, f"prlimit --pid {AGENT} --cpu=1:1 --nofile=4:4 2>&1; echo rc=$?; "
                       "prlimit --pid 1 --cpu --noheadings -o SOFT,HARD; "
                       "sleep 1 & prlimit --pid $! --nofile=64:64 && echo own-child-ok",
                 user="root")  # fmt: skip
    assert "rc=1" in r.text and "unlimited unlimited" in " ".join(r.text.split()), r.text
    assert "own-child-ok" in r.text  # the limits of its own processes are still root's to set
    for _ in range(30):  # the agent spends its CPU time: a 1 s RLIMIT_CPU would SIGKILL it
        assert (await sh(info, "echo ok")).text.strip() == "ok"


async def test_an_agent_killed_from_the_host_leaves_a_failed_sandbox(make_sandbox, runtime, caplog):
    info = await make_sandbox(workspace_id="failed-ws")
    await sh(info, "echo kept > /workspace/ws.txt; echo kept > /home/user/layer.txt")
    os.kill(info.init_pid, signal.SIGKILL)  # a bug: nothing inside can do this
    deadline = time.monotonic() + 10
    with caplog.at_level(logging.WARNING, logger="sandhold.runtime.runtime"):
        while (got := runtime.get(info.id)).state != "failed":
            assert time.monotonic() < deadline, "the sandbox was never marked failed"
            await asyncio.sleep(0.05)
    assert got.failed_at and abs(got.failed_at - time.time()) < 30
    assert "agent (pid 1)" in (got.failure or "") and "signal 9" in (got.failure or "")
    assert any("failed" in r.message and info.id in r.message for r in caplog.records)
    # Kept as it was: listed, its files (the writable layer, the workspace) in place.
    assert info.id in [i.id for i in runtime.list()]
    assert (info.dir / "root" / "home" / "user" / "layer.txt").read_text() == "kept\n"
    workspace = runtime.workspace_path("failed-ws")
    assert (workspace / "ws.txt").read_text() == "kept\n"
    assert runtime.usage(info.id).pids == 0
    with pytest.raises(Exception, match="failed"):
        runtime.resume(info.id)
    with pytest.raises(Exception, match="failed"):
        runtime.pause(info.id)
    # A restarted runtime finds it failed too (and does not reap it).
    assert Runtime(runtime.settings).open().get(info.id).state == "failed"
    cg_dirs = runtime.cgroup(info.id).dirs()
    runtime.kill(info.id)  # removes everything of it but the workspace
    assert not info.dir.exists() and not any(d.exists() for d in cg_dirs)
    assert not mounts.mounts_under(info.dir)
    assert info.id not in [i.id for i in runtime.list()]
    assert (workspace / "ws.txt").read_text() == "kept\n"


async def test_nothing_of_the_host_layout_is_visible_inside(make_sandbox, runtime):
    info = await make_sandbox(workspace_id="layout-ws")
    data = str(runtime.settings.data_dir)
    await sh(info, "(sleep 600 &)")
    r = await sh(info, "ps -ef; tr '\\0' ' ' < /proc/1/cmdline; env; for p in /proc/[0-9]*; do "
                       "tr '\\0' '\\n' < $p/environ; done 2>/dev/null", user="root")  # fmt: skip
    assert "sandhold/agent" in r.text  # the agent's own argv: nothing of the host
    assert data not in r.text and "bwrap" not in r.text
    mountinfo = (await sh(info, "cat /proc/self/mountinfo")).text
    binds = []
    for line in mountinfo.splitlines():
        fields = line.split()
        tail = fields[fields.index("-") + 1 :]  # fs type, source, super options
        assert data not in " ".join([fields[4], fields[5], *tail]), line  # overlay layers too
        if data in fields[3]:
            binds.append(fields[4])
    # The kernel shows a bind's root as its path in the source's filesystem: the workspace and
    # the agent's library (docs/security.md says so); nothing else of the data dir.
    assert sorted(binds) == ["/opt/sandhold/lib", "/workspace"], mountinfo
    assert "/run/sandhold" not in mountinfo  # the agent's socket and config are not bound


# -- through the official SDK ---------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = new_server(tmp_path_factory.mktemp("kill-attacks"), lifecycle_interval_s="0.2")
    srv.start()
    yield srv
    srv.destroy()


def test_kill_everything_as_root_through_the_sdk(server):
    sbx = Sandbox.create(timeout=300, **server.sdk())
    try:
        sbx.files.write("/home/user/keep.txt", "kept")
        sbx.commands.run("sleep 600", background=True, user="root")
        try:
            sbx.commands.run("kill -9 -1", user="root")
        except CommandExitException:
            pass
        assert sbx.is_running()
        assert sbx.commands.run("cat /home/user/keep.txt").stdout == "kept"
        assert sbx.commands.run("pgrep -c -x sleep || true").stdout.strip() == "0"
    finally:
        sbx.kill()


def test_a_failed_sandbox_on_the_e2b_surface(server):
    """Its agent died: the data plane answers as for a killed sandbox, the control plane lists it
    as paused (the SDK knows no other state) and refuses to resume it; a kill removes it; one
    created to be killed at its timeout is removed then."""
    opts = server.sdk()
    sbx = Sandbox.create(timeout=300, metadata={"case": "failed"}, **opts)
    brief = Sandbox.create(timeout=3, metadata={"case": "failed-brief"}, **opts)
    rt = server.runtime()
    for s in (sbx, brief):
        os.kill(rt.get(s.sandbox_id).init_pid, signal.SIGKILL)
    time.sleep(0.3)
    assert not sbx.is_running()  # 502 "The sandbox was not found"
    listed = Sandbox.list(query=SandboxQuery(metadata={"case": "failed"}), **opts).next_items()
    assert [(s.sandbox_id, s.state) for s in listed] == [(sbx.sandbox_id, SandboxState.PAUSED)]
    assert Sandbox.get_info(sbx.sandbox_id, **opts).state == SandboxState.PAUSED
    with httpx.Client(base_url=server.url, headers={"X-API-KEY": KEY_A}) as api:
        r = api.post(f"/sandboxes/{sbx.sandbox_id}/connect", json={"timeout": 60})
        assert r.status_code == 404 and "failed" in r.json()["message"], r.text
        assert api.post(f"/sandboxes/{sbx.sandbox_id}/pause").status_code == 404
    with pytest.raises(NotFoundException):
        Sandbox.connect(sbx.sandbox_id, **opts)
    assert sbx.kill() is True
    assert not (server.data_dir / "sandboxes" / sbx.sandbox_id).exists()
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sbx.sandbox_id, **opts)
    deadline = time.monotonic() + 30
    while (server.data_dir / "sandboxes" / brief.sandbox_id).exists():
        assert time.monotonic() < deadline, "a failed kill-on-timeout sandbox outlived its end"
        time.sleep(0.2)
