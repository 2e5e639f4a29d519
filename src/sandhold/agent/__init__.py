"""The in-sandbox agent: an envd-compatible server the e2b SDK can drive unmodified.

Runs inside every sandbox as ``python3 -I -S .../agent/__main__.py --config FILE`` and may
import only the standard library and h11. Modules:

* ``__main__`` - bootstrap (sys.path, descriptors 0-2) and entry point; ``server`` - routes, socket,
  signals; ``config`` - the start-up JSON.
* ``aio`` - the event loop (asyncio's API, for memory: docs/runtime.md): ``aio_loop`` futures,
  tasks and the loop, ``aio_sync`` waiting, timeouts and locks, ``aio_net`` sockets and
  streams; ``log`` - log lines on stderr.
* ``http`` - HTTP/1.1 on h11 over unix sockets; ``tunnel`` - its CONNECT handler, a
  byte tunnel to a loopback port; ``egress`` - the sandbox's end of the egress proxy.
* ``rpc`` - messages, field access and ``RpcError``, as every RPC method sees them;
  ``connect`` - the Connect protocol (JSON codec): unary, server and client streams, errors,
  per-call context and the caller's user.
* ``process`` - the ``process.Process`` RPCs; ``process_table`` - running commands (output
  fan-out, input, signals, resize) and reaping; ``spawn`` - fork/exec with privilege drop, pipes
  or a PTY; ``exit_status`` - Go's view of a wait status; ``supervisor`` - the template's
  services, started at boot and restarted.
* ``filesystem`` - ``filesystem.Filesystem`` RPCs; ``watch`` - inotify watchers; ``fsutil`` -
  EntryInfo, metadata xattrs, directory creation and removal.
* ``files`` - ``GET/POST /files``; ``files_headers`` - their header values; ``files_upload`` -
  gzip bodies and writing uploaded files; ``multipart`` - the form parser; ``view`` - the file
  view the file API is held to; ``system`` - ``/health``, ``/envs``, ``/metrics``.
* ``users`` - /etc/passwd and /etc/group, path resolution, acting as a user (fsuid/euid);
  ``libc`` - ctypes calls the standard library lacks (loaded lazily).
* ``checkpoint`` - getting ready for a CRIU checkpoint (connections closed, the socket handed
  back) and taking the host's new one after a restore; ``sudo`` - ``sudo`` of ``base``: the
  agent runs the command as root for its caller.

Flat on purpose: the host copies ``agent/*.py`` (and h11) into each sandbox's read-only library.
"""
