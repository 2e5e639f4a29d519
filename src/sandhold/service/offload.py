"""``Offload``: the one thread pool that moves the (synchronous) runtime's work off the event
loop. The service makes one and hands it to each part that calls the runtime (builds, pools,
warm checkpoints, suspends, snapshots, forks, metrics) and to the surfaces (``e2b/control.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

RUNTIME_THREADS = 16  # creates, kills, pauses and resumes in flight at once

T = TypeVar("T")


class Offload:
    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(RUNTIME_THREADS, thread_name_prefix="sandhold-rt")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Runtime work on a worker thread, so that its blocking parts (create mounts and waits
        for bwrap, kill waits for processes and removes directories, flocks) never stall other
        traffic, and creates overlap (twice the creates per second on 2 CPUs). The caller's
        context variables are not copied to the thread (``run_in_executor``'s way)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def close(self) -> None:
        """Wait for the work already started: a kill cut short would leave a half-removed
        sandbox behind."""
        await asyncio.to_thread(self._executor.shutdown, True)
