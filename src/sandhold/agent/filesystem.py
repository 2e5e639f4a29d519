"""``filesystem.Filesystem``: Stat, MakeDir, Move, ListDir, Remove and directory watching,
each done with the caller's filesystem identity."""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING

from . import aio
from .config import AgentConfig
from .connect import Call
from .fsutil import ensure_dirs, entry_info, make_parents, os_error, remove_all
from .rpc import Message, RpcError, get_bool, get_int, get_str
from .users import User, UserError, fs_identity, resolve_path
from .view import Access, ViewGuard

if TYPE_CHECKING:
    from .watch import DirWatcher

MAX_WATCHER_EVENTS = 100_000  # a polled watcher nobody polls must not grow forever
STREAM_QUEUE = 10_000


class FilesystemService:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.view = ViewGuard.from_config(config.file_view)
        self.watchers: dict[str, _PolledWatcher] = {}

    def _path(self, raw: str, user: User, access: Access, follow_last: bool = True) -> str:
        try:
            path = resolve_path(raw, user, self.config.default_workdir)
        except ValueError as e:
            raise RpcError("invalid_argument", str(e)) from None
        denial = self.view.denial(path, access, follow_last=follow_last)
        if denial:
            raise RpcError("permission_denied", denial)
        return path

    # -- unary ----------------------------------------------------------------------------------
    async def stat(self, msg: Message, call: Call) -> Message:
        user = call.user
        path = self._path(get_str(msg, "path"), user, "read")
        try:
            with fs_identity(user):
                return {"entry": entry_info(path)}
        except FileNotFoundError as e:
            raise RpcError("not_found", f"file not found: {_enoent(e, path)}") from None
        except OSError as e:
            raise os_error(e, "error getting file info") from None
        except UserError as e:
            raise RpcError("permission_denied", str(e)) from None

    async def make_dir(self, msg: Message, call: Call) -> Message:
        user = call.user
        path = self._path(get_str(msg, "path"), user, "write")
        try:
            with fs_identity(user):
                try:
                    st = os.stat(path)
                except FileNotFoundError:
                    st = None
                if st is not None:
                    if stat.S_ISDIR(st.st_mode):
                        raise RpcError("already_exists", f"directory already exists: {path}")
                    raise RpcError(
                        "invalid_argument", f"path already exists but it is not a directory: {path}"
                    )
            make_parents(path, user.uid, user.gid)
            with fs_identity(user):
                ensure_dirs(path)
                return {"entry": entry_info(path)}
        except OSError as e:
            raise os_error(e, "error creating directory") from None
        except UserError as e:
            raise RpcError("permission_denied", str(e)) from None

    async def move(self, msg: Message, call: Call) -> Message:
        user = call.user
        source = self._path(get_str(msg, "source"), user, "write", follow_last=False)
        destination = self._path(get_str(msg, "destination"), user, "write", follow_last=False)
        try:
            make_parents(posixpath.dirname(destination), user.uid, user.gid)
            with fs_identity(user):
                ensure_dirs(posixpath.dirname(destination))
                try:
                    os.rename(source, destination)
                except FileNotFoundError:
                    raise RpcError(
                        "not_found", f"source file not found: rename {source} {destination}"
                    ) from None
                return {"entry": entry_info(destination)}
        except OSError as e:
            raise os_error(e, "error renaming") from None
        except UserError as e:
            raise RpcError("permission_denied", str(e)) from None

    async def list_dir(self, msg: Message, call: Call) -> Message:
        user = call.user
        depth = get_int(msg, "depth") or 1  # envd: 0 means the directory's own entries
        requested = self._path(get_str(msg, "path"), user, "read")
        try:
            with fs_identity(user):
                try:
                    real = os.path.realpath(requested, strict=True)
                except FileNotFoundError:
                    raise RpcError("not_found", f"path not found: {requested}") from None
                except OSError as e:
                    if e.errno == 40:  # ELOOP
                        raise RpcError(
                            "failed_precondition",
                            f"cyclic symlink or chain >255 links at {requested!r}",
                        ) from None
                    raise
                if not os.path.isdir(real):
                    raise RpcError("invalid_argument", f"path is not a directory: {requested}")
                return {"entries": _walk(requested, real, depth)}
        except OSError as e:
            raise os_error(e, "error reading directory") from None
        except UserError as e:
            raise RpcError("permission_denied", str(e)) from None

    async def remove(self, msg: Message, call: Call) -> Message:
        user = call.user
        path = self._path(get_str(msg, "path"), user, "write", follow_last=False)
        try:
            with fs_identity(user):
                remove_all(path)
        except OSError as e:
            raise os_error(e, "error removing file or directory") from None
        except UserError as e:
            raise RpcError("permission_denied", str(e)) from None
        return {}

    # -- watching -------------------------------------------------------------------------------
    def _watch_root(self, msg: Message, user: User) -> str:
        path = self._path(get_str(msg, "path"), user, "read")
        try:
            with fs_identity(user):
                st = os.stat(path)
        except FileNotFoundError:
            raise RpcError("not_found", f"path {path} not found") from None
        except OSError as e:
            raise os_error(e, f"error statting path {path}") from None
        except UserError as e:
            raise RpcError("permission_denied", str(e)) from None
        if not stat.S_ISDIR(st.st_mode):
            raise RpcError("invalid_argument", f"path {path} not a directory")
        return path

    def _watcher(
        self,
        msg: Message,
        user: User,
        root: str,
        on_event: Callable[[Message], None],
        on_error: Callable[[str], None],
    ) -> DirWatcher:
        from .watch import DirWatcher

        watcher = DirWatcher(
            root,
            user,
            recursive=get_bool(msg, "recursive"),
            include_entry=get_bool(msg, "include_entry"),
            on_event=on_event,
            on_error=on_error,
        )
        try:
            watcher.start()
        except OSError as e:
            raise os_error(e, f"error adding path {root} to watcher") from None
        return watcher

    async def watch_dir(self, msg: Message, call: Call) -> AsyncGenerator[Message, None]:
        user = call.user
        root = self._watch_root(msg, user)
        queue: aio.Queue[Message | str] = aio.Queue()

        def on_event(event: Message) -> None:
            if queue.qsize() >= STREAM_QUEUE:
                on_error("watcher error: client is not keeping up with events")
            else:
                queue.put_nowait(event)

        def on_error(message: str) -> None:
            queue.put_nowait(message)

        watcher = self._watcher(msg, user, root, on_event, on_error)
        interval = call.keepalive_interval
        try:
            yield {"start": {}}
            while True:
                try:
                    item = await aio.wait_for(queue.get(), interval)
                except TimeoutError:
                    yield {"keepalive": {}}
                    continue
                if isinstance(item, str):
                    raise RpcError("internal", item)
                yield {"filesystem": item}
        finally:
            watcher.close()

    async def create_watcher(self, msg: Message, call: Call) -> Message:
        user = call.user
        root = self._watch_root(msg, user)
        polled = _PolledWatcher()
        polled.watcher = self._watcher(msg, user, root, polled.add, polled.fail)
        watcher_id = "w" + os.urandom(8).hex()
        self.watchers[watcher_id] = polled
        return {"watcherId": watcher_id}

    def _polled(self, msg: Message) -> tuple[str, _PolledWatcher]:
        watcher_id = get_str(msg, "watcher_id")
        polled = self.watchers.get(watcher_id)
        if polled is None:
            raise RpcError("not_found", f"watcher with id {watcher_id} not found")
        return watcher_id, polled

    async def get_watcher_events(self, msg: Message, call: Call) -> Message:
        _, polled = self._polled(msg)
        if polled.error is not None:
            raise RpcError("internal", polled.error)
        events, polled.events = polled.events, []
        return {"events": events}

    async def remove_watcher(self, msg: Message, call: Call) -> Message:
        watcher_id, polled = self._polled(msg)
        if polled.watcher is not None:
            polled.watcher.close()
        del self.watchers[watcher_id]
        return {}

    def close(self) -> None:
        for polled in self.watchers.values():
            if polled.watcher is not None:
                polled.watcher.close()
        self.watchers.clear()


class _PolledWatcher:
    def __init__(self) -> None:
        self.events: list[Message] = []
        self.error: str | None = None
        self.watcher: DirWatcher | None = None

    def add(self, event: Message) -> None:
        if len(self.events) >= MAX_WATCHER_EVENTS:
            del self.events[: len(self.events) // 2]
        self.events.append(event)

    def fail(self, message: str) -> None:
        self.error = message


def _enoent(e: OSError, path: str) -> str:
    return f"lstat {e.filename or path}: no such file or directory"


def _walk(requested: str, real: str, depth: int) -> list[Message]:
    """Entries below ``real`` down to ``depth`` levels, pre-order and sorted like Go's
    WalkDir, reported under ``requested``; symlinks are listed, not followed."""

    def children(d: str, shown: str, level: int) -> list[tuple[os.DirEntry[str], str, int]]:
        with os.scandir(d) as it:
            entries = sorted(it, key=lambda e: e.name)
        return [(e, posixpath.join(shown, e.name), level) for e in reversed(entries)]

    out: list[Message] = []
    stack = children(real, requested, 1)  # the directory itself must be readable
    while stack:
        e, display, level = stack.pop()
        try:
            out.append(entry_info(e.path, display, e.stat(follow_symlinks=False)))
        except FileNotFoundError:
            continue  # vanished while we walked
        if level < depth and e.is_dir(follow_symlinks=False):
            try:
                stack += children(e.path, display, level + 1)
            except OSError:
                pass  # an unreadable subdirectory: list what we can
    return out
