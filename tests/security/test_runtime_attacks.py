"""Process- and kernel-level attacks from inside a real sandbox. Each must fail, and the host and
a neighbour sandbox must be unaffected (checked once per module, after every attack ran)."""

from __future__ import annotations

import os
import shlex

import pytest
import pytest_asyncio

from tests.runtime.helpers import sh

pytestmark = pytest.mark.asyncio(loop_scope="module")

# Syscalls the seccomp filter denies, called directly so no library can paper over them.
# (name, x86_64 number, args)
DENIED_SYSCALLS = [
    ("keyctl", 250, (0, 0, 0)),
    ("add_key", 248, (0, 0, 0)),
    ("bpf", 321, (0, 0, 0)),
    ("perf_event_open", 298, (0, 0, 0)),
    ("io_uring_setup", 425, (1, 0, 0)),
    ("userfaultfd", 323, (0, 0, 0)),
    ("finit_module", 313, (0, 0, 0)),
    ("kexec_load", 246, (0, 0, 0)),
    ("reboot", 169, (0xFEE1DEAD, 672274793, 0x1234567)),
    ("open_by_handle_at", 304, (0, 0, 0)),
    ("ptrace", 101, (16, 1, 0)),  # PTRACE_ATTACH to pid 1
    ("process_vm_readv", 310, (1, 0, 0)),
    ("setns", 308, (0, 0, 0)),
    ("pivot_root", 155, (0, 0, 0)),
    ("mount", 165, (0, 0, 0)),
    ("swapon", 167, (0, 0, 0)),
    ("acct", 163, (0, 0, 0)),
    ("clock_settime", 227, (0, 0, 0)),
]


def _syscall_probe(nr: int, args: tuple[int, ...]) -> str:
    return (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"rc = libc.syscall({nr}, *{args!r})\n"
        "print(rc, ctypes.get_errno())\n"
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def victim(runtime):
    """One sandbox attacked by every test of this module, and a neighbour that must not notice."""
    info = runtime.create({"workspace_id": "victim-ws"})
    neighbour = runtime.create({"workspace_id": "neighbour-ws"})
    await sh(neighbour, "echo untouched > /workspace/canary; sleep 100000 >/dev/null 2>&1 &")
    yield info
    r = await sh(neighbour, "cat /workspace/canary; pgrep -c sleep")
    assert r.text.split() == ["untouched", "1"], "the neighbour was affected"
    runtime.kill(info.id)
    runtime.kill(neighbour.id)


async def py(info, code: str, user: str | None = None) -> str:
    return (await sh(info, f"python3 -c {shlex.quote(code)} 2>&1", user=user)).text


@pytest.mark.parametrize(
    ("name", "nr", "args"), DENIED_SYSCALLS, ids=[s[0] for s in DENIED_SYSCALLS]
)
@pytest.mark.parametrize("user", ["root", "user"])
async def test_dangerous_syscalls_are_denied(victim, name, nr, args, user):
    out = (await py(victim, _syscall_probe(nr, args), user=user)).split()
    assert out[0] == "-1", f"{name} as {user} returned {out}"
    assert out[1] in ("1", "38"), f"{name}: errno {out[1]}"  # EPERM, or ENOSYS for clone3-likes


async def test_kernel_memory_and_sysrq_are_out_of_reach(victim):
    r = await sh(victim, "head -c 16 /proc/kcore >/dev/null 2>&1 && echo READ; "
                         "echo b > /proc/sysrq-trigger 2>/dev/null && echo SYSRQ; "
                         "echo 3 > /proc/sys/vm/drop_caches 2>/dev/null && echo SYSCTL; "
                         "echo evil > /proc/sys/kernel/hostname 2>/dev/null && echo HOST; true",
                 user="root")  # fmt: skip
    assert r.text.strip() == "", r.text
    assert (await sh(victim, "hostname")).text.strip() == "sandbox"


async def test_no_sysfs_and_no_cgroup_files(victim):
    cmd = "ls -A /sys | wc -l; ls /sys/fs/cgroup 2>&1 | head -1; cat /proc/self/cgroup"
    r = await sh(victim, cmd, user="root")
    lines = r.text.splitlines()
    assert lines[0] == "0"
    assert "No such file" in lines[1]
    # Inside its cgroup namespace the sandbox sees itself at the root: no host cgroup paths.
    assert all(line.endswith(":/") for line in lines[2:]), lines


async def test_device_nodes_cannot_be_made_or_opened(victim):
    r = await sh(victim, "mknod /tmp/sda b 8 0 2>&1; echo rc=$?; ls /dev", user="root")
    assert "rc=0" not in r.text
    devices = set(r.text.splitlines()[-1].split()) if "\n" in r.text else set()
    assert not {"sda", "vda", "mem", "kmem", "kvm", "fuse"} & set(r.text.split())
    del devices


async def test_setuid_binaries_grant_nothing(victim):
    # Root plants a setuid-root shell; `user` runs it: no_new_privs keeps it uid 1000.
    r = await sh(victim, "cp /bin/bash /opt/rootsh && chmod 4755 /opt/rootsh && stat -c %A "
                         "/opt/rootsh", user="root")  # fmt: skip
    assert r.text.strip() == "-rwsr-xr-x"
    r = await sh(victim, "/opt/rootsh -p -c 'id -u; id -ru'")
    assert r.text.split() == ["1000", "1000"]
    # The host's setuid binaries (bound read-only with /usr) do not help either.
    r = await sh(victim, "su -c id root </dev/null 2>&1; mount -t tmpfs x /mnt 2>&1; echo done")
    assert "uid=0" not in r.text


async def test_user_cannot_touch_the_agent(victim):
    # (all but itself and the shell that carries its output: CI saw the output end with it)
    r = await py(victim, "import os\nfor p in os.listdir('/proc'):\n"
                         "    if p.isdigit():\n"
                         "        try: os.kill(int(p), 9) if int(p) not in (os.getpid(), "
                         "os.getppid()) else None\n"
                         "        except OSError as e: pass\n"
                         "print('tried')")  # fmt: skip
    assert "tried" in r
    # The agent (and so the sandbox) still answers.
    assert (await sh(victim, "echo alive")).text.strip() == "alive"
    r = await sh(victim, "cat /proc/1/environ 2>&1; ls /run/sandhold 2>&1 | head -1")
    assert "Permission denied" in r.text  # the agent's environment is not user's to read ...
    assert "No such file" in r.text  # ... and its socket is not in the sandbox at all


async def test_root_cannot_ptrace_or_read_agent_memory(victim):
    r = await py(victim, "import os\n"
                         "agent = [p for p in os.listdir('/proc') if p.isdigit() and "
                         "b'agent' in open(f'/proc/{p}/cmdline','rb').read()][0]\n"
                         "try:\n  open(f'/proc/{agent}/mem','rb').read(1); print('READ')\n"
                         "except OSError as e: print('denied', e.errno)\n",
                 user="root")  # fmt: skip
    assert "READ" not in r and "denied" in r


async def test_ipc_namespaces_are_private(victim, runtime):
    other = runtime.create({})
    try:
        await sh(victim, "echo secret > /dev/shm/leak; ipcmk -M 4096")
        r = await sh(other, "cat /dev/shm/leak 2>&1; ipcs -m | grep -c 0x")
        assert "secret" not in r.text and r.text.split()[-1] == "0"
    finally:
        runtime.kill(other.id)


async def test_runtime_code_and_template_are_read_only(victim):
    r = await sh(victim, "touch /opt/sandhold/lib/sandhold/evil.py 2>&1; echo rc=$?; "
                         "touch /usr/lib/evil 2>&1; echo rc=$?", user="root")  # fmt: skip
    assert "rc=0" not in r.text


async def test_hostname_and_namespaces_cannot_be_changed(victim):
    r = await sh(victim, "hostname evil 2>&1; echo rc=$?; unshare -n true 2>&1; echo rc=$?; "
                         "unshare -r true 2>&1; echo rc=$?", user="root")  # fmt: skip
    assert "rc=0" not in r.text
    assert (await sh(victim, "hostname")).text.strip() == "sandbox"


async def test_raw_and_netlink_sockets_are_refused(victim):
    # Netlink route, xfrm, audit, uevents; packet; raw ICMP: refused. Only sock_diag opens
    # (what `ss` needs), and it lists the sandbox's own sockets only.
    r = await py(victim, "import socket\n"
                         "for fam, typ, proto in [(16, 3, 0), (16, 3, 6), (16, 3, 9), (16, 3, 15),"
                         " (17, 3, 0), (2, 3, 1)]:\n"
                         "    try: socket.socket(fam, typ, proto); print('OPEN', fam)\n"
                         "    except OSError as e: print('refused', fam, e.errno)\n",
                 user="root")  # fmt: skip
    assert "OPEN" not in r and r.count("refused") == 6, r
    listening = await sh(victim, "python3 -m http.server 8765 >/dev/null 2>&1 & sleep 0.5; "
                         "ss -Htln; kill %1")  # fmt: skip
    assert ":8765" in listening.text and ":49983" not in listening.text, listening.text


async def test_terminal_injection_is_refused(victim):
    r = await py(victim, "import fcntl, termios, os, pty\n"
                         "m, s = pty.openpty()\n"
                         "try: fcntl.ioctl(s, termios.TIOCSTI, b'x'); print('INJECTED')\n"
                         "except OSError as e: print('refused', e.errno)\n")  # fmt: skip
    assert "INJECTED" not in r and "refused" in r


async def test_proc_root_links_stay_inside(victim):
    cmd = (
        "cat /proc/1/root/etc/shadow 2>&1; ls /proc/1/root/ 2>&1 | head -3; "
        "cat /proc/self/root/../../../etc/passwd | cut -d: -f1 | sort | tr '\\n' ' '"
    )
    r = await sh(victim, cmd, user="root")
    assert "root:" not in r.text.split("\n")[0]
    assert r.text.strip().endswith("nobody root user")


async def test_workspace_of_another_session_is_unreachable(victim, runtime):
    neighbour_ws = runtime.workspace_path("neighbour-ws")
    assert (neighbour_ws / "canary").exists()
    cmd = f"ls {neighbour_ws} 2>&1; find / -name canary -not -path '/proc/*' 2>/dev/null"
    r = await sh(victim, cmd, user="root")
    assert "untouched" not in r.text and "/canary" not in r.text


async def test_fork_exhaustion_never_reaches_the_host(victim, runtime):
    """A self-sustaining fork bomb fills the sandbox's pid quota and nothing more; the sandbox
    can still be killed cleanly (the victim of the other tests is spared: this one is its own)."""
    bomber = runtime.create({"limits": {"pids": 128}})
    host_pids_before = len([p for p in os.listdir("/proc") if p.isdigit()])
    bomb = "import os\nwhile True:\n  try: os.fork()\n  except OSError: pass"
    await sh(bomber, f"(python3 -c {shlex.quote(bomb)} >/dev/null 2>&1 &); sleep 2; echo ok")
    assert runtime.usage(bomber.id).pids <= 128
    assert len([p for p in os.listdir("/proc") if p.isdigit()]) < host_pids_before + 200
    assert (await sh(victim, "echo unaffected")).text.strip() == "unaffected"
    cg_dirs = runtime.cgroup(bomber.id).dirs()
    runtime.kill(bomber.id)
    assert not any(d.exists() for d in cg_dirs)
