"""A cgroup-v2-only Linux guest for the tests that must run on the kernels users have.

This machine's controllers are held by cgroup v1 and its ``/dev/kvm`` runs no stock kernel, so the
guest is Debian's stock kernel (``linux-image-amd64`` from the machine's own apt sources, unpacked
with ``dpkg -x``, not installed) under ``qemu-system-x86_64 -M microvm`` with TCG, booted with
``cgroup_no_v1=all``. Its root is this machine's root shared read-only over virtio-9p under a tmpfs
overlay (the guest writes in RAM), an ext4 scratch disk holds ``/var/tmp`` and ``TMPDIR``
(idmapped mounts need a real filesystem; this machine's ``/tmp`` stays visible, and a checkout
under ``/var/tmp`` is bound back over the scratch disk), and a second 9p share carries the
command and its output. It has no network device: loopback only. The kernel and the initramfs
are built once and cached (``CACHE``), keyed by the
kernel package and the init script.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("SANDHOLD_GUEST_CACHE", "/var/cache/sandhold/guest"))
# The modules the initramfs loads before the root is up (with their dependencies).
EARLY_MODULES = ("virtio_mmio", "9p", "9pnet_virtio", "overlay", "virtio_blk", "ext4", "loop")

# PID 1 of the initramfs: mount the shared root under a tmpfs overlay, the scratch disk on
# /mnt/scratch, the exchange share on /mnt/guest, then hand over to the command's script.
INIT = r"""#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /mods/order); do insmod /mods/$m; done
fail() { echo "guest init: $*"; echo o > /proc/sysrq-trigger; sleep 60; }
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,access=client,msize=262144 \
  hostroot /host || fail "no root share"
mount -t tmpfs -o size=60%,mode=0755 tmpfs /rw
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/host,upperdir=/rw/upper,workdir=/rw/work /newroot \
  || fail "no overlay root"
mount -t tmpfs -o mode=0755 tmpfs /newroot/run
mkdir -p /newroot/mnt/guest
mount -t 9p -o trans=virtio,version=9p2000.L,access=client,msize=262144 guest /newroot/mnt/guest \
  || fail "no exchange share"
mkdir -p /newroot/mnt/scratch
mount -t ext4 /dev/vda /newroot/mnt/scratch || fail "no scratch disk"
mkdir -p /newroot/mnt/scratch/tmp /newroot/mnt/scratch/var-tmp
chmod 1777 /newroot/mnt/scratch/tmp /newroot/mnt/scratch/var-tmp
mount --move /dev /newroot/dev
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
exec switch_root /newroot /bin/sh /mnt/guest/init.sh
"""

# PID 1 on the real root: what a booted host would have, then the command's script, either
# directly (PID 1 must not exit: the script powers off) or as a unit of systemd, booted as PID 1.
BOOT = """#!/bin/sh
{var_tmp}
# The kernel loads its own modules on demand (CRIU's socket diagnostics, nf_tables) from the
# kit: not bound under /usr, whose submounts a sandbox's /usr would carry (CRIU then cannot
# restore it)
printf '#!/bin/sh\\nexec /sbin/modprobe -d {kit_root} "$@"\\n' > /run/modprobe
chmod 755 /run/modprobe
echo /run/modprobe > /proc/sys/kernel/modprobe
{init}
"""
# /var/tmp on the scratch disk; a checkout under it (the command's cwd) is bound back on top.
VAR_TMP = "mount --bind /mnt/scratch/var-tmp /var/tmp"
KEEP_CWD = """mkdir -p /run/keep && mount --bind {cwd} /run/keep
mount --bind /mnt/scratch/var-tmp /var/tmp
mkdir -p {cwd} && mount --move /run/keep {cwd}"""
DIRECT = """mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup
mkdir -p /dev/pts /dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
ip link set lo up
exec /bin/sh /mnt/guest/command.sh"""
SYSTEMD = """mkdir -p /etc/systemd/system
printf '[Service]\\nType=oneshot\\nExecStart=/bin/sh /mnt/guest/command.sh\\n' \\
  > /etc/systemd/system/sandhold-guest.service
# (its boot-time clean-up would empty /tmp, a checkout there included)
ln -sf /dev/null /etc/systemd/system/systemd-tmpfiles-setup.service
exec /lib/systemd/systemd --unit=sandhold-guest.service"""

# The command, its output and status kept in the exchange share, then power off.
COMMAND = """#!/bin/sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
export TMPDIR=/mnt/scratch/tmp
{env}
cd {cwd}
( {command} ) > /mnt/guest/output 2>&1 < /dev/null
echo $? > /mnt/guest/status
sync
echo o > /proc/sysrq-trigger
sleep 60
"""


@dataclass(frozen=True)
class Kit:
    kernel: Path
    initrd: Path
    release: str  # the kernel's uname -r
    root: Path  # the unpacked package: its modules for the guest's modprobe


@dataclass(frozen=True)
class Result:
    status: int | None  # None: the guest ended without the command's status (a crash, a timeout)
    output: str
    console: str  # the kernel's messages


def _run(argv: list[str], cwd: Path | None = None) -> str:
    return subprocess.run(argv, cwd=cwd, check=True, capture_output=True, text=True).stdout


def kernel_package() -> str:
    """The package ``linux-image-amd64`` depends on in the machine's apt sources."""
    for line in _run(["apt-cache", "depends", "linux-image-amd64"]).splitlines():
        name = line.strip().removeprefix("Depends: ")
        if name.startswith("linux-image-") and name != line.strip():
            return name
    raise RuntimeError("no linux-image package behind linux-image-amd64 in the apt sources")


def kit() -> Kit:
    """The guest's kernel and initramfs, built once per kernel package and init script."""
    package = kernel_package()
    key = hashlib.sha256(INIT.encode() + " ".join(EARLY_MODULES).encode()).hexdigest()[:12]
    d = CACHE / f"{package}-{key}"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (d / "initrd.gz").exists():
            _build(package, d)
    release = package.removeprefix("linux-image-")
    boot = d / "root" / "boot"
    return Kit(boot / f"vmlinuz-{release}", d / "initrd.gz", release, d / "root")


def _build(package: str, d: Path) -> None:
    work = Path(tempfile.mkdtemp(dir=CACHE, prefix=".build-"))
    try:
        os.chmod(work, 0o755)  # apt's download user reads it
        _run(["apt-get", "download", "-q", package], cwd=work)
        (deb,) = work.glob("*.deb")
        _run(["dpkg", "-x", str(deb), str(work / "root")])
        deb.unlink()
        release = package.removeprefix("linux-image-")
        _run(["depmod", "-b", str(work / "root"), release])
        _initramfs(work, release)
        shutil.rmtree(d, ignore_errors=True)
        work.rename(d)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _initramfs(work: Path, release: str) -> None:
    tree = work / "initramfs"
    for sub in ("bin", "mods", "proc", "sys", "dev", "host", "rw", "newroot"):
        (tree / sub).mkdir(parents=True)
    shutil.copy2("/bin/busybox", tree / "bin" / "busybox")
    order: list[str] = []
    for module in EARLY_MODULES:
        deps = _run(["modprobe", "-d", str(work / "root"), "-S", release, "--show-depends", module])
        for line in deps.splitlines():
            path = Path(line.split()[1])
            if path.name not in order:
                shutil.copy2(path, tree / "mods" / path.name)
                order.append(path.name)
    (tree / "mods" / "order").write_text("\n".join(order) + "\n")
    (tree / "init").write_text(INIT)
    (tree / "init").chmod(0o755)
    files = _run(["find", "."], cwd=tree)
    cpio = subprocess.run(["busybox", "cpio", "-o", "-H", "newc"], cwd=tree, input=files.encode(),
                          check=True, capture_output=True).stdout  # fmt: skip
    subprocess.run(["gzip", "-1"], input=cpio, check=True, stdout=open(work / "initrd.gz", "wb"))  # noqa: SIM115


def _tsc_khz() -> int:
    """The host's TSC rate: a stock kernel under TCG hangs calibrating it unless told."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("cpu MHz"):
            return int(float(line.split(":")[1]) * 1000)
    return 2_000_000


def run(
    command: str,
    *,
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout_s: float = 600,
    memory_mb: int = 3072,
    scratch_gb: int = 8,
    systemd: bool = False,
) -> Result:
    """Boot a guest, run ``command`` with ``/bin/sh`` in ``cwd`` (a path of this machine's root),
    and power it off; its output and status come back through the exchange share. With
    ``systemd``, the machine's systemd boots as PID 1 and runs the command as a unit."""
    booted = kit()
    with tempfile.TemporaryDirectory(prefix="sandhold-guest-", dir="/var/tmp") as tmp:
        ex = Path(tmp)
        exports = "\n".join(f"export {n}={shlex.quote(v)}" for n, v in (env or {}).items())
        init = SYSTEMD if systemd else DIRECT
        var_tmp = KEEP_CWD if cwd.is_relative_to("/var/tmp") else VAR_TMP
        var_tmp = var_tmp.format(cwd=shlex.quote(str(cwd)))
        (ex / "init.sh").write_text(BOOT.format(kit_root=booted.root, init=init, var_tmp=var_tmp))
        (ex / "command.sh").write_text(
            COMMAND.format(env=exports, cwd=shlex.quote(str(cwd)), command=command)
        )
        scratch = ex / "scratch.img"
        with open(scratch, "wb") as f:
            f.truncate(scratch_gb << 30)
        _run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=1,nodiscard", str(scratch)])
        append = (f"console=ttyS0 cgroup_no_v1=all tsc_early_khz={_tsc_khz()} tsc=reliable "
                  "panic=1 quiet")  # fmt: skip
        argv = [
            "qemu-system-x86_64", "-M", "microvm", "-accel", "tcg", "-cpu", "max",
            "-smp", "2", "-m", str(memory_mb), "-nographic", "-no-reboot", "-nodefaults",
            "-serial", "stdio", "-kernel", str(booted.kernel), "-initrd", str(booted.initrd),
            "-append", append,
            "-fsdev", "local,id=hostroot,path=/,readonly=on,security_model=none,multidevs=remap",
            "-device", "virtio-9p-device,fsdev=hostroot,mount_tag=hostroot",
            "-fsdev", f"local,id=guest,path={ex},security_model=none",
            "-device", "virtio-9p-device,fsdev=guest,mount_tag=guest",
            "-drive", f"id=scratch,file={scratch},format=raw,if=none,cache=unsafe",
            "-device", "virtio-blk-device,drive=scratch",
        ]  # fmt: skip
        try:
            console = subprocess.run(argv, capture_output=True, text=True, errors="replace",
                                     timeout=timeout_s, check=False).stdout  # fmt: skip
        except subprocess.TimeoutExpired as e:
            out = e.stdout
            console = out.decode(errors="replace") if isinstance(out, bytes) else out or ""
            console += f"\n[guest killed after {timeout_s:g} s]"
        status = (ex / "status").read_text().strip() if (ex / "status").exists() else ""
        output = (ex / "output").read_text(errors="replace") if (ex / "output").exists() else ""
        return Result(int(status) if status.isdigit() else None, output, console)
