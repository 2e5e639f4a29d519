"""The agent's log: lines on stderr (the host's log file for the sandbox, which the E2B API's
``GET /sandboxes/{id}/logs`` serves: runtime/sandbox_log.py), as the standard ``logging`` module
would write them with ``<UTC time> sandhold-agent: LEVEL message``, without its ~0.8 MiB per
agent. ``log.info("... %s", x)``: arguments are formatted only for lines written.

The file is bounded: past ``INFO_MAX`` bytes only warnings and errors are written, past
``ALL_MAX`` nothing (a chatty start command cannot fill the host's disk)."""

from __future__ import annotations

import os
import sys
import time

INFO_MAX = 8 << 20
ALL_MAX = 16 << 20
_disabled = False


def stamp(t: float | None = None) -> str:
    """``2026-12-05T19:20:50.123Z``"""
    t = time.time() if t is None else t
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"


def disable(off: bool) -> None:
    """While the agent's stderr goes nowhere (a checkpoint's quiesce), nothing is written."""
    global _disabled
    _disabled = off


def _write(level: str, msg: str, args: tuple[object, ...]) -> None:
    if _disabled:
        return
    try:
        text = msg % args if args else msg
    except (TypeError, ValueError):
        text = f"{msg} {args!r}"
    try:
        size = os.fstat(2).st_size
        if size > ALL_MAX or (size > INFO_MAX and level == "INFO"):
            return
        sys.stderr.write(f"{stamp()} sandhold-agent: {level} {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # a log that cannot be written must not take the agent down


def info(msg: str, *args: object) -> None:
    _write("INFO", msg, args)


def warning(msg: str, *args: object) -> None:
    _write("WARNING", msg, args)


def error(msg: str, *args: object) -> None:
    _write("ERROR", msg, args)


def exception(msg: str, *args: object, exc_info: BaseException | None = None) -> None:
    """``error`` and the exception (``exc_info``, or the one being handled) with its
    traceback."""
    _write("ERROR", msg, args)
    exc = exc_info or sys.exc_info()[1]
    if exc is not None and not _disabled:
        import traceback  # only when it happens: it imports linecache and tokenize

        traceback.print_exception(exc, file=sys.stderr)
