"""Directory watching with inotify (through ctypes), reported like envd's fsnotify watcher.

inotify → event types as fsnotify maps them: CREATE/MOVED_TO → create, MODIFY → write,
DELETE/DELETE_SELF → remove, MOVED_FROM/MOVE_SELF → rename, ATTRIB → chmod. Names are
relative to the watched directory. A recursive watch adds every directory below, including
ones created later.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable

from . import aio, libc
from .fsutil import entry_info
from .rpc import Message
from .users import User, fs_identity

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

WATCH_MASK = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
)
_EVENT = struct.Struct("iIII")

# Order as envd emits the operations of one fsnotify event.
_OPS = (
    (IN_CREATE | IN_MOVED_TO, "EVENT_TYPE_CREATE"),
    (IN_MOVED_FROM | IN_MOVE_SELF, "EVENT_TYPE_RENAME"),
    (IN_ATTRIB, "EVENT_TYPE_CHMOD"),
    (IN_MODIFY, "EVENT_TYPE_WRITE"),
    (IN_DELETE | IN_DELETE_SELF, "EVENT_TYPE_REMOVE"),
)
# Only these carry an entry: stat-ing after a remove/rename could describe a newcomer.
_WITH_ENTRY = {"EVENT_TYPE_CREATE", "EVENT_TYPE_WRITE", "EVENT_TYPE_CHMOD"}


class DirWatcher:
    """Watches ``root``; calls ``on_event(FilesystemEvent)`` or ``on_error(message)``."""

    def __init__(
        self,
        root: str,
        user: User,
        recursive: bool,
        include_entry: bool,
        on_event: Callable[[Message], None],
        on_error: Callable[[str], None],
    ) -> None:
        self.root = root
        self.user = user
        self.recursive = recursive
        self.include_entry = include_entry
        self.on_event = on_event
        self.on_error = on_error
        self._fd = -1
        self._dirs: dict[int, str] = {}
        self._loop: aio.Loop | None = None

    def start(self) -> None:
        self._fd = libc.inotify_init(IN_NONBLOCK | IN_CLOEXEC)
        try:
            with fs_identity(self.user):
                self._add(self.root)
                if self.recursive:
                    self._add_tree(self.root)
        except BaseException:
            self.close()
            raise
        self._loop = aio.get_running_loop()
        self._loop.add_reader(self._fd, self._on_readable)

    def close(self) -> None:
        if self._fd >= 0:
            if self._loop is not None:
                self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1

    def _add(self, path: str) -> None:
        wd = libc.inotify_add_watch(self._fd, path, WATCH_MASK)
        self._dirs[wd] = path

    def _add_tree(self, top: str) -> None:
        stack = [top]
        while stack:
            d = stack.pop()
            try:
                with os.scandir(d) as it:
                    for e in it:
                        if e.is_dir(follow_symlinks=False):
                            try:
                                self._add(e.path)
                            except OSError:
                                continue  # vanished or unreadable: nothing to watch there
                            stack.append(e.path)
            except OSError:
                continue

    def _on_readable(self) -> None:
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        except OSError as e:
            self._fail(f"watcher error: {e}")
            return
        offset = 0
        while offset + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
            raw = data[offset + _EVENT.size : offset + _EVENT.size + length]
            offset += _EVENT.size + length
            name = os.fsdecode(raw.rstrip(b"\0"))
            if mask & IN_Q_OVERFLOW:
                self._fail("watcher error: fsnotify: queue or buffer overflow")
                return
            if mask & IN_IGNORED:
                self._dirs.pop(wd, None)
                continue
            self._handle(wd, mask, name)

    def _handle(self, wd: int, mask: int, name: str) -> None:
        base = self._dirs.get(wd)
        if base is None:
            return
        if not name:
            # *_SELF on a subdirectory is already reported by its parent as a child event.
            if base != self.root:
                return
            path = base
        else:
            path = os.path.join(base, name)
        if self.recursive and mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO):
            try:
                with fs_identity(self.user):
                    self._add(path)
                    self._add_tree(path)
            except OSError:
                pass
        rel = os.path.relpath(path, self.root)
        for bits, kind in _OPS:
            if not mask & bits:
                continue
            event: Message = {"name": rel, "type": kind}
            if self.include_entry and kind in _WITH_ENTRY:
                try:
                    with fs_identity(self.user):
                        event["entry"] = entry_info(path)
                except OSError:
                    pass  # gone again already: the event still counts, without an entry
            self.on_event(event)

    def _fail(self, message: str) -> None:
        self.close()
        self.on_error(message)
