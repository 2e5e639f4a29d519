"""Go's ``ProcessState`` view of a wait status, which envd's end event carries: "exit status
1", "signal: killed" and the exit code and error that go with them."""

from __future__ import annotations

import os

from .rpc import Message

# Go's syscall.Signal.String() on Linux, which envd's end event status uses.
_GO_SIGNAL_NAMES = {
    1: "hangup",
    2: "interrupt",
    3: "quit",
    4: "illegal instruction",
    5: "trace/breakpoint trap",
    6: "aborted",
    7: "bus error",
    8: "floating point exception",
    9: "killed",
    10: "user defined signal 1",
    11: "segmentation fault",
    12: "user defined signal 2",
    13: "broken pipe",
    14: "alarm clock",
    15: "terminated",
    16: "stack fault",
    17: "child exited",
    18: "continued",
    19: "stopped (signal)",
    20: "stopped",
    21: "stopped (tty input)",
    22: "stopped (tty output)",
    23: "urgent I/O condition",
    24: "CPU time limit exceeded",
    25: "file size limit exceeded",
    26: "virtual timer expired",
    27: "profiling timer expired",
    28: "window changed",
    29: "I/O possible",
    30: "power failure",
    31: "bad system call",
}


def end_event(status: int) -> Message:
    """The EndEvent for a wait status, as Go's ProcessState reports it."""
    if os.WIFEXITED(status):
        code, exited = os.WEXITSTATUS(status), True
        text = f"exit status {code}"
    elif os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        code, exited = -1, False
        text = "signal: " + _GO_SIGNAL_NAMES.get(sig, f"signal {sig}")
        if os.WCOREDUMP(status):
            text += " (core dumped)"
    else:
        code, exited, text = -1, False, f"status {status}"
    event: Message = {"exitCode": code, "exited": exited, "status": text}
    if code != 0:
        event["error"] = text  # exec.Cmd.Wait's error for an unsuccessful exit
    return event
