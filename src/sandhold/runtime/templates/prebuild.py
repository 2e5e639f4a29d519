"""Build a template in a process of its own: ``python -m sandhold.runtime.templates.prebuild ROOT
UID NAME``.

A server builds the slow templates (``code-interpreter-v1``: a minute of ``pip download``) in
the background at start-up. In a thread, a build cannot be stopped: its ``pip`` outlived the
server. In a process group of its own it can (``stop``), and SIGTERM unwinds the build, so its
staging directory is removed. Builds take the template store's file locks, so a create that
needs the template meanwhile waits for this process's build.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path

STOP_GRACE_S = 5.0


async def start(templates_root: Path, uid_base: int, name: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sandhold.runtime.templates.prebuild",
        str(templates_root),
        str(uid_base),
        name,
        start_new_session=True,
        stdin=asyncio.subprocess.DEVNULL,
    )


async def stop(proc: asyncio.subprocess.Process) -> None:
    """End the build and everything it started (its process group); wait for it."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds the build: its finally blocks remove staging dirs


def main(argv: list[str]) -> int:
    from sandhold.errors import SandholdError
    from sandhold.runtime.templates.store import TemplateStore

    root, uid_base, name = Path(argv[0]), int(argv[1]), argv[2]
    signal.signal(signal.SIGTERM, _terminated)
    try:
        TemplateStore(root, uid_base).get(name)
    except SandholdError as e:
        print(f"could not build template {name}: {e.message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
