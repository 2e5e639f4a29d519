"""Escapes that must fail. Each test attempts the attack from inside a real sandbox."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

from tests.runtime.helpers import py, sh


async def test_host_files_outside_binds_are_invisible(make_sandbox, tmp_path):
    secret = Path("/root/sandhold-test-secret")
    secret.write_text("host secret")
    try:
        sbx = await make_sandbox()
        for path in (str(secret), "/etc/shadow", str(tmp_path), "/work", "/var/lib/sandhold"):
            r = await sh(sbx, f"cat {path} 2>&1 || ls {path} 2>&1")
            assert "host secret" not in r.text
            assert r.exit_code != 0, f"{path} is visible inside the sandbox: {r.text}"
        # /etc inside is the template's, not the host's: no shadow file, no host users.
        r = await sh(sbx, "cut -d: -f1 /etc/passwd | sort | tr '\\n' ' '")
        assert r.text.split() == ["nobody", "root", "user"]
    finally:
        secret.unlink()


async def test_host_processes_are_invisible_and_unsignalable(make_sandbox):
    sbx = await make_sandbox()
    r = await sh(sbx, "ls /proc | grep -E '^[0-9]+$' | wc -l")
    assert int(r.text) < 10, "the sandbox sees more processes than its own"
    me = os.getpid()
    r = await py(sbx, f"import os\ntry:\n os.kill({me}, 9)\nexcept OSError as e: print(e.errno)")
    assert r.text.strip() == "3"  # ESRCH: the host pid does not exist in the sandbox
    # As root inside, too.
    r = await sh(sbx, f"kill -9 {me}; echo rc=$?", user="root")
    assert "rc=1" in r.text
    assert os.getpid() == me


async def test_host_loopback_and_abstract_sockets_are_unreachable(make_sandbox):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(b"\0sandhold-test-abstract")
    abstract.listen()
    accepted: list[object] = []

    def accept() -> None:
        try:
            accepted.append(srv.accept())
        except OSError:
            pass  # closed at the end of the test, with nothing accepted

    waiter = threading.Thread(target=accept, daemon=True)
    waiter.start()
    try:
        sbx = await make_sandbox()
        r = await py(
            sbx,
            "import socket\n"
            # Only the host's own loopback: the sandbox has no other interface to try (checked
            # below), and tests never aim at private ranges or the internet.
            f"for target in [('127.0.0.1', {port})]:\n"
            "    s = socket.socket(); s.settimeout(2)\n"
            "    try: s.connect(target); print('CONNECTED', target)\n"
            "    except OSError as e: print('blocked', target, e.errno)\n"
            "u = socket.socket(socket.AF_UNIX)\n"
            "try: u.connect(b'\\0sandhold-test-abstract'); print('CONNECTED abstract')\n"
            "except OSError as e: print('blocked abstract', e.errno)\n",
        )
        assert "CONNECTED" not in r.text, r.text
        assert r.text.count("blocked") == 2
        assert not accepted
        r = await sh(sbx, "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '")
        assert r.text.split() == ["lo"]
    finally:
        srv.shutdown(socket.SHUT_RDWR)
        srv.close()
        abstract.close()
        waiter.join(5)


async def test_template_is_read_only_and_writes_stay_in_the_sandbox(make_sandbox, runtime):
    sbx = await make_sandbox()
    r = await sh(sbx, "touch /usr/bin/evil; echo rc=$?", user="root")
    assert "rc=0" not in r.text
    assert not Path("/usr/bin/evil").exists()
    r = await sh(sbx, "echo pwned >> /etc/hostname && echo ok", user="root")
    assert r.text.strip() == "ok"
    template = runtime.templates.get("base")
    assert "pwned" not in (template.rootfs / "etc/hostname").read_text()
    other = await make_sandbox()
    r = await sh(other, "cat /etc/hostname")
    assert "pwned" not in r.text


async def test_mount_userns_and_privilege_attempts_fail(make_sandbox):
    sbx = await make_sandbox()
    attacks = {
        "mount": "mount -t tmpfs none /mnt",
        "unshare-user": "unshare -U true",
        "unshare-mount": "unshare -m true",
        "chroot": "chroot / true",
        "nsenter": "nsenter -t 1 -m true",
    }
    for user in ("root", "user"):
        for name, cmd in attacks.items():
            r = await sh(sbx, f"{cmd} 2>&1; echo rc=$?", user=user)
            assert "rc=0" not in r.text, f"{name} as {user} succeeded: {r.text}"
    r = await py(
        sbx,
        "import ctypes, errno\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.unshare(0x10000000), ctypes.get_errno())",  # CLONE_NEWUSER
        user="root",
    )
    assert r.text.split()[0] == "-1"


async def test_root_inside_is_nobody_on_the_host(make_sandbox, runtime):
    sbx = await make_sandbox(workspace_id="rootcheck")
    r = await sh(sbx, "id -u; grep -E '^Cap(Eff|Prm|Bnd|Amb)' /proc/self/status; "
                      "cat /proc/self/uid_map; (sleep 60 &); echo ok", user="root")  # fmt: skip
    assert r.text.split("\n")[0] == "0"
    for cap in ("CapEff", "CapPrm", "CapBnd", "CapAmb"):
        assert f"{cap}:\t0000000000000000" in r.text, r.text
    base = runtime.get(sbx.id).host_uid  # its own range, past the canonical one
    assert base > runtime.uid_base
    assert f"0 {base:10d}      65536" in r.text  # the map sends sandbox uid 0 to its range
    # Seen from the host, no process of the sandbox, root's sleep included, is host root.
    host_uids = {os.stat(f"/proc/{pid}").st_uid for pid in runtime.cgroup(sbx.id).pids()}
    assert host_uids <= {base, base + 1000}, host_uids
    r = await sh(
        sbx, "id -u; id -un; echo $HOME; touch /workspace/by-user; touch /root/x; echo rc=$?"
    )
    assert r.text.split("\n")[:3] == ["1000", "user", "/home/user"]
    assert "rc=1" in r.text
    # stored with the canonical owner: whichever range the next sandbox gets sees it as `user`
    assert (
        runtime.workspace_path("rootcheck") / "by-user"
    ).stat().st_uid == runtime.uid_base + 1000
    r = await sh(sbx, "grep NoNewPrivs /proc/self/status; grep Seccomp: /proc/self/status")
    assert "NoNewPrivs:\t1" in r.text and "Seccomp:\t2" in r.text


async def test_sandboxes_cannot_see_each_other(make_sandbox):
    a = await make_sandbox(workspace_id="iso-a")
    b = await make_sandbox(workspace_id="iso-b")
    await sh(b, "echo b-secret > /workspace/secret; echo b > /tmp/b; (sleep 300 &) ; echo ok")
    r = await sh(a, "cat /workspace/secret /tmp/b 2>&1")
    assert "b-secret" not in r.text and r.exit_code != 0
    r = await sh(a, "pgrep -c sleep")
    assert r.text.strip() == "0"
    # The agent's socket is the host's: nothing of it is bound into a sandbox.
    r = await sh(a, "ls -la /run/sandhold 2>&1; find / -xdev -type s 2>/dev/null | wc -l")
    assert "No such file" in r.text and r.text.split()[-1] == "0"
