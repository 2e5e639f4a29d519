"""A sandbox that escaped its mount namespace (one kernel bug) must still find its neighbours'
processes and files out of reach: each sandbox runs in a host uid range of its own, so `user`
(uid 1000) of one sandbox is not `user` of the next, on the host.

The escape is played from the host: a process with exactly the host credentials of sandbox A's
root or user (and nothing else: no capability, no namespace) attacks sandbox B, whose processes
and files run and sit under the same in-sandbox uids. The same attacks against A's own
processes and files succeed (A's root owns A's user namespace, so it may signal and trace A's
processes; A's user owns A's files): that is what every neighbour was open to when all
sandboxes shared one host identity."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox

from sandhold.runtime.runtime import Runtime, SandboxInfo
from tests.runtime.helpers import sh
from tests.support.e2b_server import KEY_A, Server, new_server

# Run on the host as the attacker: each attack's outcome, "ok" or the errno's name.
ATTACKS = r"""
import ctypes, errno, json, os, sys
target = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def ptrace(pid):
    if libc.ptrace(16, pid, None, None) != 0:  # PTRACE_ATTACH
        raise OSError(ctypes.get_errno(), "ptrace")
    os.waitpid(pid, 0)
    libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
def write(path):
    with open(path, "w") as f:
        f.write("planted")
out = {
    "signal": attempt(lambda: os.kill(target["pid"], 0)),
    "environ": attempt(lambda: open(f"/proc/{target['pid']}/environ", "rb").read()),
    "ptrace": attempt(lambda: ptrace(target["pid"])),
    "read_home": attempt(lambda: open(target["home_secret"]).read()),
    "read_workspace": attempt(lambda: open(target["workspace_secret"]).read()),
    "read_view": attempt(lambda: open(target["view_secret"]).read()),
    "plant": attempt(lambda: write(target["plant"])),
}
print(json.dumps(out))
"""


async def _victim(make_sandbox, runtime: Runtime, name: str) -> tuple[SandboxInfo, dict]:
    """A sandbox whose `user` keeps a process and 0600 files in its home and workspace."""
    info = await make_sandbox(workspace_id=f"uid-{name}")
    await sh(info, "umask 077; echo secret > ~/secret; echo secret > /workspace/secret; "
                   "(sleep 600 &)")  # fmt: skip
    pid = None
    for _ in range(500):  # the subshell forks, then its child execs sleep
        pid = next((p for p in runtime.cgroup(info.id).pids() if _is_sleep(p)), None)
        if pid is not None:
            break
        time.sleep(0.005)
    assert pid is not None, "the victim's sleep never started"
    return info, {
        "pid": pid,
        "home_secret": str(info.dir / "root/home/user/secret"),
        "workspace_secret": str(runtime.workspace_path(f"uid-{name}") / "secret"),  # on disk
        "view_secret": str(info.dir / "views/0/secret"),  # as the sandbox's range sees it
        "plant": str(info.dir / "root/home/user/planted"),
    }


def _is_sleep(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep\0")
    except OSError:
        return False


def _attack_as(uid: int, target: dict) -> dict[str, str]:
    r = subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
         "--", sys.executable, "-I", "-c", ATTACKS, json.dumps(target)],
        capture_output=True, text=True, cwd="/",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


async def test_a_neighbours_processes_and_files_are_out_of_reach(make_sandbox, runtime):
    a, a_target = await _victim(make_sandbox, runtime, "a")
    b, b_target = await _victim(make_sandbox, runtime, "b")
    a_uid, b_uid = runtime.get(a.id).host_uid, runtime.get(b.id).host_uid
    assert a_uid != b_uid and abs(a_uid - b_uid) >= 65536  # disjoint ranges
    # Controls: A's own identities reach A's processes and files.
    as_root, as_user = _attack_as(a_uid, a_target), _attack_as(a_uid + 1000, a_target)
    assert [as_root[k] for k in ("signal", "ptrace")] == ["ok"] * 2, as_root
    assert [as_user[k] for k in ("signal", "read_home", "read_view", "plant")] == ["ok"] * 4
    # A's user and A's root against B's user, same in-sandbox uid 1000: all refused.
    for attacker in (a_uid + 1000, a_uid):
        got = _attack_as(attacker, b_target)
        assert got == {
            "signal": "EPERM", "environ": "EACCES", "ptrace": "EPERM", "read_home": "EACCES",
            "read_workspace": "EACCES", "read_view": "EACCES", "plant": "EACCES",
        }, (attacker, got)  # fmt: skip
    r = await sh(b, "cat ~/secret; ls ~; pgrep -c sleep")
    assert r.text.split() == ["secret", "secret", "1"], r.text


async def test_one_sandbox_cannot_exhaust_a_per_user_limit_of_its_neighbours(make_sandbox):
    """The kernel counts inotify instances per host user (128 here): with one shared identity
    a sandbox that takes them all breaks file watching in every other sandbox."""
    a = await make_sandbox()
    b = await make_sandbox()
    hog = (
        "import ctypes, os, time\nlibc = ctypes.CDLL(None, use_errno=True)\nn = 0\n"
        "while libc.inotify_init1(0) >= 0:\n    n += 1\n"
        "open('/tmp/hogged', 'w').write(f'{n} {ctypes.get_errno()}')\ntime.sleep(600)\n"
    )
    await sh(a, f"(python3 -c \"{hog}\" &); "
                "for i in $(seq 200); do [ -s /tmp/hogged ] && break; sleep 0.05; done; "
                "cat /tmp/hogged")  # fmt: skip
    held, err = (await sh(a, "cat /tmp/hogged")).text.split()
    assert int(held) > 0 and err == "24", (held, err)  # EMFILE: A holds all it may
    r = await sh(b, 'python3 -c "import ctypes; print(ctypes.CDLL(None).inotify_init1(0) >= 0)"')
    assert r.text.strip() == "True", r.text


async def test_templates_and_workspaces_keep_their_owners_across_ranges(make_sandbox, runtime):
    first = await make_sandbox(workspace_id="uid-shared")
    await sh(first, "echo mine > /workspace/by-user; mkdir -m 777 /workspace/dir")
    await sh(first, "echo root > /workspace/dir/by-root", user="root")  # (root has no caps)
    first_uid = first.host_uid
    runtime.kill(first.id)
    keep = await make_sandbox()  # holds a range, so the next sandbox may get another
    second = await make_sandbox(workspace_id="uid-shared")
    assert keep.host_uid is not None and second.host_uid is not None
    assert first_uid is not None
    r = await sh(
        second,
        "stat -c '%u %g %n' / /root /home/user /etc/passwd /workspace /workspace/by-user "
        "/workspace/dir /workspace/dir/by-root; "
        "echo more >> /workspace/by-user && cat /workspace/by-user",
    )
    lines = r.text.splitlines()
    assert lines[:8] == [
        "0 0 /", "0 0 /root", "1000 1000 /home/user", "0 0 /etc/passwd",
        "1000 1000 /workspace", "1000 1000 /workspace/by-user", "1000 1000 /workspace/dir",
        "0 0 /workspace/dir/by-root",
    ], r.text  # fmt: skip
    assert lines[8:] == ["mine", "more"]
    # On disk everything stays with the canonical owners, whichever range wrote it.
    ws = runtime.workspace_path("uid-shared")
    assert os.stat(ws / "by-user").st_uid == runtime.uid_base + 1000
    assert os.stat(ws / "dir/by-root").st_uid == runtime.uid_base


def test_ranges_are_given_back_and_reused(runtime):
    before = runtime.uids.held()
    info = runtime.create({})
    assert runtime.uids.held() == {**before, info.host_uid: info.id}
    runtime.kill(info.id)
    assert runtime.uids.held() == before
    again = runtime.create({})
    try:
        # The lowest free range, once nothing is left: the one given back, or a lower one
        # another test of the host (ranges are host-wide) gave back meanwhile.
        assert again.host_uid <= info.host_uid
    finally:
        runtime.kill(again.id)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = new_server(tmp_path_factory.mktemp("uid-attacks"))
    srv.start()
    yield srv
    srv.destroy()


def test_official_sdk_sandboxes_run_in_distinct_ranges(server):
    sdk = {"api_url": server.url, "sandbox_url": server.url, "api_key": KEY_A}
    sandboxes = [Sandbox.create(**sdk) for _ in range(2)]
    try:
        ids = []
        for sbx in sandboxes:
            r = sbx.commands.run("cat /proc/self/uid_map; id -u; stat -c %u /home/user")
            lines = r.stdout.split("\n")
            ids.append(int(lines[0].split()[1]))
            assert lines[1:3] == ["1000", "1000"], r.stdout
        assert len(set(ids)) == 2, ids
    finally:
        for sbx in sandboxes:
            sbx.kill()


@pytest.fixture
def ramfs() -> Iterator[Path]:
    """A filesystem that cannot be idmapped (as NFS cannot), mounted for one test."""
    d = Path(tempfile.mkdtemp(prefix="sandhold-ramfs-", dir="/var/tmp"))
    subprocess.run(["mount", "-t", "ramfs", "-o", "mode=755", "ramfs", str(d)], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=True)
        d.rmdir()


async def test_a_tree_that_cannot_be_idmapped_is_lent_to_the_range_and_given_back(
    make_sandbox, runtime, ramfs
):
    ws = ramfs / "ws"
    ws.mkdir()
    first = await make_sandbox(workspace_dir=str(ws))
    await sh(first, "echo mine > /workspace/by-user; stat -c %u /workspace/by-user")
    assert os.stat(ws / "by-user").st_uid == first.host_uid + 1000  # lent while it runs
    runtime.kill(first.id)
    assert os.stat(ws / "by-user").st_uid == runtime.uid_base + 1000  # back to canonical
    assert os.stat(ws).st_uid == runtime.uid_base + 1000
    second = await make_sandbox(workspace_dir=str(ws))
    r = await sh(second, "stat -c %u /workspace/by-user; echo more >> /workspace/by-user; "
                         "cat /workspace/by-user")  # fmt: skip
    assert r.text.split() == ["1000", "mine", "more"], r.text
