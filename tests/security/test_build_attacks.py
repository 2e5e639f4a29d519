"""Attacks from a template build step (runtime/templates/build.py): root in a build sandbox keeps
the capabilities a container build needs, in its own user namespace only. Each attack must fail, and
what the step leaves (its layer) must hold nothing the host's root owns."""

from __future__ import annotations

import os
from pathlib import Path

from sandhold.runtime.templates.build import Builder, BuildRequest, Step

# name -> a command that must fail (exit non-zero) in the step
ATTACKS = {
    "mount": "mount -t tmpfs none /mnt",
    "write-host-usr": "touch /usr/sandhold-build-probe",
    "chown-unmapped": "touch /opt/x && chown 70000 /opt/x",
    "nested-userns": "unshare -U -r true",
    "sysctl": "echo 1 > /proc/sys/kernel/sysrq",
    "host-shadow": "test -r /etc/shadow && grep -q . /etc/shadow",
    "raw-socket": "python3 -c 'import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW)'",
    # (exits 0, "succeeded", only if finit_module was not refused)
    "load-module": "python3 -c 'import ctypes; l = ctypes.CDLL(None); "
    "raise SystemExit(l.syscall(313, -1, None, 0) == -1)'",
}


def test_a_build_step_stays_in_its_sandbox(runtime) -> None:
    probe = " ".join(
        f"if ({cmd}) >/dev/null 2>&1; then echo 'ESCAPED {name}'; else echo 'refused {name}'; fi;"
        for name, cmd in ATTACKS.items()
    )
    script = (f"{probe} awk 'NR==1 {{print \"hostuid\", $2}}' /proc/self/uid_map; "
              "cp /usr/bin/id /opt/suid-id && chmod 4755 /opt/suid-id")  # fmt: skip
    lines: list[str] = []
    tpl = Builder(runtime, {}.__getitem__).build(
        BuildRequest("built-attacks", "base", [Step("RUN", [script, "root"])]),
        lambda _l, m: lines.append(m),
    )
    try:
        assert [f"refused {name}" for name in ATTACKS] == [
            line for line in lines if line.split(" ")[0] in ("refused", "ESCAPED")
        ], lines
        host_uid = int(next(line for line in lines if line.startswith("hostuid")).split()[1])
        assert host_uid >= 65536  # the step's root is an unprivileged uid of the host
        layer = Path(tpl.layers[0])
        st = os.lstat(layer / "opt" / "suid-id")
        assert st.st_uid != 0 and st.st_gid != 0  # a setuid file, of nobody on the host
        owners = {os.lstat(p).st_uid for p in layer.rglob("*")}
        assert 0 not in owners, owners
        assert not Path("/usr/sandhold-build-probe").exists()
    finally:
        runtime.templates.remove("built-attacks")
        runtime.layers.collect(runtime.templates)
