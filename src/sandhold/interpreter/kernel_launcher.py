"""Starts an IPython kernel, like ``python -m ipykernel_launcher``, adapted to the sandbox.

Run by file path (``python3 .../kernel_launcher.py -f conn.json``). One adaptation: ipykernel
binds a TCP socket on 127.0.0.1 to collect the output of forked child processes, and libzmq
resolves a TCP bind address by first listing network interfaces over netlink, which the
sandbox's seccomp filter refuses; libzmq then aborts the whole kernel. The pipe moves to a unix
socket (``ipc://``), which needs no address resolution and behaves the same.

A kernel also starts without three packages it cannot use here (``_defer_unused_imports``),
about a third of its memory.
"""

from __future__ import annotations

import os
import sys
import tempfile
import types
from collections.abc import Callable

# Running a file puts its directory first on sys.path; user code must find its own working
# directory there instead (as with `-m ipykernel_launcher`), never our modules.
sys.path[0] = os.getcwd()


def _patch_iopub_pipe() -> None:
    import zmq
    from ipykernel import iostream, kernelapp
    from zmq.eventloop.zmqstream import ZMQStream

    class IPCIOPubThread(iostream.IOPubThread):
        def _setup_pipe_in(self) -> None:
            ctx = self.socket.context
            self._pipe_uuid = os.urandom(16)
            pipe_in = ctx.socket(zmq.PULL)
            pipe_in.linger = 0
            self._pipe_dir = tempfile.mkdtemp(prefix="ipykernel-pipe-")
            self._pipe_address = f"ipc://{self._pipe_dir}/iopub"
            pipe_in.bind(self._pipe_address)
            self._pipe_in = ZMQStream(pipe_in, self.io_loop)
            self._pipe_in.on_recv(self._handle_pipe_msg)

        def _setup_pipe_out(self):  # type: ignore[no-untyped-def]
            ctx = zmq.Context()  # a forked child needs a context of its own
            pipe_out = ctx.socket(zmq.PUSH)
            pipe_out.linger = 3000
            pipe_out.connect(self._pipe_address)
            return ctx, pipe_out

    kernelapp.IOPubThread = IPCIOPubThread  # type: ignore[misc]


def _skip_empty_flushes() -> None:
    """ipykernel flushes stdout and stderr six times per execution, each flush a round trip to
    the IOPub thread (two wake-ups and a wait) even when nothing was written. A stream holding
    nothing since its last flush has nothing to send: what it held is already being sent by
    the IOPub thread, ahead of anything scheduled after (its events run in order)."""
    from ipykernel.iostream import OutStream

    flush = OutStream.flush

    def flush_if_written(self: OutStream) -> None:
        if self._buffers or self.echo is not None:
            flush(self)

    OutStream.flush = flush_if_written  # type: ignore[method-assign]


def _defer_unused_imports() -> Callable[[], None]:
    """Keeps out of the kernel's start what it cannot use, ~18 of its ~51 MiB; returns the
    function that lets the user's code import all of it as usual, once the kernel is set up.

    * ``debugpy``: ipykernel imports its server at start for the Jupyter debugger, which no
      E2B API reaches, and which binds a TCP port that libzmq cannot resolve here (see above).
      Without it the kernel says ``"debugger": false`` in its kernel_info.
    * ``jedi``: IPython imports it at start for completions, which no E2B API asks for; its
      completer falls back to its own matchers.
    * ``prompt_toolkit`` (the terminal IPython): ``IPython/__init__`` imports
      ``IPython.terminal.embed`` only to offer ``IPython.embed``. That name stays; it imports
      the terminal IPython when called.
    """
    blocked = ("debugpy", "jedi")
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]  # "import X" raises ImportError

    embed_name = "IPython.terminal.embed"
    stub = types.ModuleType(embed_name, "Stands in until the kernel is set up.")

    def embed(*args: object, **kwargs: object) -> object:
        from IPython.terminal.embed import embed as terminal_embed

        return terminal_embed(*args, **kwargs)

    stub.embed = embed  # type: ignore[attr-defined]
    sys.modules[embed_name] = stub

    def release() -> None:
        for name in blocked:
            if sys.modules.get(name, ...) is None:
                del sys.modules[name]
        if sys.modules.get(embed_name) is stub:
            del sys.modules[embed_name]

    return release


if __name__ == "__main__":
    release_deferred = _defer_unused_imports()
    _patch_iopub_pipe()
    _skip_empty_flushes()
    from ipykernel.kernelapp import IPKernelApp

    # As ipykernel's launch_new_instance, with one change: traitlets leaves the kernel's logger
    # at DEBUG and filters at its handler (the app's log_level), so every message the kernel
    # handles built debug records that were then dropped; they are not built now.
    app = IPKernelApp.instance()
    app.initialize()
    release_deferred()
    app.log.setLevel(app.log_level)
    app.start()
