"""`sandhold init -- COMMAND...`: a small init for a container or pod, whose PID 1 it is.

In a pod the server must not be PID 1: when PID 1 ends, the kernel ends its PID namespace, and
every sandbox in it with it. As PID 1 this init keeps the namespace while the server restarts
in place: it starts COMMAND (``sandhold serve``), starts it again whenever it ends on its own
(a crash, an OOM kill, a `kill` from an operator), and reaps every process that is orphaned to
it, as a sandbox's launcher is once its server is gone. A SIGTERM, SIGINT or SIGHUP (the pod
stopping, after its ``preStop`` drain) goes to COMMAND, and the init ends with its status.
Outside PID 1 it makes itself the subreaper of what it starts, so the same holds.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from typing import Annotated

import typer

PR_SET_CHILD_SUBREAPER = 36
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
QUICK_S = 10.0  # a command that ends sooner after its start is started again after a delay


def init(
    command: Annotated[list[str], typer.Argument(help="the command to keep running")],
    delay: Annotated[float, typer.Option(help="seconds before restarting a quick failure")] = 1.0,
) -> None:
    """Run COMMAND as a pod's PID 1 would need it: restarted in place, orphans reaped."""
    if os.getpid() != 1:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    sys.exit(Supervisor(command, delay).run())


class Supervisor:
    def __init__(self, command: list[str], delay: float) -> None:
        self.command = command
        self.delay = delay
        self.stopping: int | None = None  # the signal that asked us to end
        self.child: int | None = None  # the running command's pid

    def run(self) -> int:
        for sig in FORWARDED:
            signal.signal(sig, self._forward)
        backoff = self.delay
        while True:
            started = time.monotonic()
            # it inherits every descriptor we were handed (the server's socket: --fd)
            self.child = os.posix_spawnp(self.command[0], self.command, os.environ)
            status = self._wait(self.child)
            self.child = None
            if self.stopping is not None:
                return status
            quick = time.monotonic() - started < QUICK_S
            backoff = min(backoff * 2, 30.0) if quick else self.delay
            what = f"sandhold init: {self.command[0]} ended ({status}); starting it again"
            print(what, file=sys.stderr, flush=True)
            if quick:
                time.sleep(backoff)
            if self.stopping is not None:
                return status

    def _wait(self, pid: int) -> int:
        """Reap every child until ``pid`` ends; its exit status (128 + N for signal N)."""
        while True:
            reaped, status = os.waitpid(-1, 0)
            if reaped == pid:
                code = os.waitstatus_to_exitcode(status)
                return code if code >= 0 else 128 - code

    def _forward(self, sig: int, _frame: object) -> None:
        self.stopping = sig
        if self.child is not None:
            os.kill(self.child, sig)
