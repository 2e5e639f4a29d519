"""The in-sandbox agent: an envd-compatible server the e2b SDK can drive unmodified.

Runs inside every sandbox as ``python3 -I -S .../agent/__main__.py --config FILE`` and may
import only the standard library and h11. Modules:

* ``__main__`` - bootstrap (sys.path, no ssl) and entry point; ``server`` - routes, socket,
  signals; ``config`` - the start-up JSON.
* ``http`` - HTTP/1.1 on h11 over asyncio unix sockets; ``connect`` - Connect protocol (JSON
  codec): unary, server and client streams, errors, per-call context.
* ``process`` - ``process.Process``: fork/exec with privilege drop, pipes or a PTY, output
  fan-out, input, signals, resize.
* ``filesystem`` - ``filesystem.Filesystem`` RPCs; ``watch`` - inotify watchers; ``fsutil`` -
  EntryInfo, metadata xattrs, directory creation and removal.
* ``files`` - ``GET/POST /files``; ``system`` - ``/health``, ``/envs``, ``/metrics``.
* ``users`` - /etc/passwd and /etc/group, path resolution, acting as a user (fsuid/euid);
  ``libc`` - ctypes calls the standard library lacks (loaded lazily).
"""
