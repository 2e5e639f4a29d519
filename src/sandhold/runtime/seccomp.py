"""The seccomp filter every sandbox runs under, compiled once to BPF and handed to bwrap as an fd.

Deny-list on top of what namespaces and dropped capabilities already prevent: it closes the
kernel surfaces that matter most for escapes (nested user namespaces, mounts, ptrace, keyrings,
BPF, perf, module and kexec loading, io_uring) and netlink (but sock_diag) and packet sockets.
"""

from __future__ import annotations

import errno
import os
import tempfile
from functools import lru_cache

DENIED_SYSCALLS = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "unshare",
    "setns",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "open_by_handle_at",
    "name_to_handle_at",
    "swapon",
    "swapoff",
    "reboot",
    "acct",
    "quotactl",
    "syslog",
    "personality",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "lookup_dcookie",
    "vhangup",
    "iopl",
    "ioperm",
    "settimeofday",
    "clock_settime",
    "adjtimex",
    "clock_adjtime",
)

CLONE_NEWUSER = 0x10000000
AF_NETLINK = 16
NETLINK_SOCK_DIAG = 4
AF_PACKET = 17
TIOCSTI = 0x5412


@lru_cache(maxsize=1)
def filter_bpf() -> bytes:
    """The compiled filter (about 0.5 KiB); building it takes ~20 ms, so it is cached."""
    import pyseccomp as S  # ctypes over the system libseccomp2

    f = S.SyscallFilter(defaction=S.ALLOW)
    for name in DENIED_SYSCALLS:
        try:
            f.add_rule(S.ERRNO(errno.EPERM), name)
        except (RuntimeError, ValueError):
            pass  # syscall unknown on this architecture
    f.add_rule(S.ERRNO(errno.EPERM), "clone", S.Arg(0, S.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
    # clone3 passes flags in memory seccomp cannot inspect: ENOSYS makes libc fall back to clone.
    f.add_rule(S.ERRNO(errno.ENOSYS), "clone3")
    # Netlink but sock_diag, which lists the sandbox's own sockets (its network namespace's):
    # `ss`, which E2B's ready commands (wait_for_port) run, needs it.
    f.add_rule(
        S.ERRNO(errno.EAFNOSUPPORT),
        "socket",
        S.Arg(0, S.EQ, AF_NETLINK),
        S.Arg(2, S.NE, NETLINK_SOCK_DIAG),
    )
    f.add_rule(S.ERRNO(errno.EAFNOSUPPORT), "socket", S.Arg(0, S.EQ, AF_PACKET))
    # Setting the limits of pid 1, the agent (root inside has its uid): RLIMIT_CPU would have
    # the kernel SIGKILL it, which its being init does not stop; RLIMIT_NOFILE would starve it.
    f.add_rule(S.ERRNO(errno.EPERM), "prlimit64", S.Arg(0, S.EQ, 1), S.Arg(2, S.NE, 0))
    # Typing into a terminal the sandbox does not own (bwrap --new-session also covers this).
    f.add_rule(S.ERRNO(errno.EPERM), "ioctl", S.Arg(1, S.MASKED_EQ, 0xFFFFFFFF, TIOCSTI))
    with tempfile.TemporaryFile() as tmp:
        f.export_bpf(tmp)
        tmp.seek(0)
        return tmp.read()


def filter_fd() -> int:
    """A fresh readable fd holding the BPF program (bwrap reads it to EOF, then closes it)."""
    data = filter_bpf()
    fd = os.memfd_create("sandhold-seccomp", os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
