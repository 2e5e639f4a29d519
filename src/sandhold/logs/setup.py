"""Where log records go: JSON lines in ``<log_path>/<component>.jsonl`` (rotated by size, each
record written through to the kernel as it is logged, fsynced every ``log_fsync_interval_s``),
and stderr (readable lines or the same JSON).

A JSON line is ``{"ts", "level", "logger", "message", <the bound ids>, <extra fields>, "exc"}``:
``ts`` is ISO 8601 in UTC with milliseconds (``2025-01-31T12:00:00.123Z``, so lines sort as
text), the ids are those of ``sandhold.logs.context`` (``request_id``, ``tenant``, ``session``,
``sandbox``; set ones only), extra fields are what the call passed as ``extra=`` (a request's
``method``, ``path``, ``status``, ``duration_ms``), ``exc`` the traceback when there is one."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import logging.handlers
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any

from sandhold.errors import ConfigError
from sandhold.logs.context import ID_FIELDS, current

COMPONENT_RE = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
SUFFIX = ".jsonl"
# uvicorn's loggers: with ``log_config=None`` uvicorn installs no handlers, and these propagate
# to ours. (Its access log stays off: it would write query strings, which carry signatures.)
UVICORN = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "color_message",
    "taskName",
}


def timestamp(created: float) -> str:
    t = dt.datetime.fromtimestamp(created, dt.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The ids and extra fields of a record: the bound ids, then ``extra=`` over them."""
    ids = current()
    out: dict[str, Any] = ids.public() if ids is not None else {}
    for key, value in record.__dict__.items():
        if key not in _STANDARD and not key.startswith("_"):
            out[key] = value
    return out


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record_fields(record).items():
            line.setdefault(key, value)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``<local time> LEVEL logger: message [request_id=… tenant=… sandbox=…]``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        text = super().formatMessage(record)
        ids = current()
        if ids is not None and (public := ids.public()):
            text += " [" + " ".join(f"{k}={v}" for k, v in public.items()) + "]"
        return text


class JsonLinesFile(logging.handlers.RotatingFileHandler):
    """A size-rotated file of mode 0600; every record is flushed to the kernel as it is written
    (a SIGKILLed process loses nothing), and a background thread fsyncs what was written every
    ``fsync_interval_s`` (0: each record is fsynced), bounding what a host crash loses."""

    def __init__(self, path: Path, max_bytes: int, backup_count: int, fsync_interval_s: float):
        self._dirty = False
        self._fsync_interval_s = fsync_interval_s
        self._stop_sync = threading.Event()
        super().__init__(path, maxBytes=max_bytes, backupCount=backup_count, encoding="utf-8")
        if fsync_interval_s > 0:
            threading.Thread(target=self._syncer, name="log-fsync", daemon=True).start()

    def _open(self) -> io.TextIOWrapper:
        fd = os.open(
            self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600
        )
        os.fchmod(fd, 0o600)  # a file left by an older process may have been wider
        stream = os.fdopen(fd, "a", encoding="utf-8")
        assert isinstance(stream, io.TextIOWrapper)
        return stream

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)  # flushes
        if self._fsync_interval_s == 0:
            self._sync()
        else:
            self._dirty = True

    def doRollover(self) -> None:
        self._sync()
        super().doRollover()

    def _sync(self) -> None:
        stream = self.stream
        if stream is not None and not stream.closed:
            try:
                os.fsync(stream.fileno())
            except OSError:
                pass  # a full disk: the write itself reports it
        self._dirty = False

    def _syncer(self) -> None:
        while not self._stop_sync.wait(self._fsync_interval_s):
            if self._dirty:
                self.acquire()
                try:
                    self._sync()
                finally:
                    self.release()

    def close(self) -> None:
        self._stop_sync.set()
        self.acquire()
        try:
            self._sync()
        finally:
            self.release()
        super().close()


def log_file(log_dir: Path, component: str) -> Path:
    if not COMPONENT_RE.match(component):
        raise ValueError(f"invalid log component {component!r}")
    return log_dir / f"{component}{SUFFIX}"


def setup(settings: Any, component: str) -> Path:
    """Send this process's records (the root logger's, uvicorn's) to ``<component>.jsonl`` under
    ``settings.log_path`` and to stderr as ``settings.log_stderr_format`` says. Replaces what an
    earlier call installed. Returns the file's path; raises ``ConfigError`` if the directory
    cannot be written.

    uvicorn must then be configured with ``log_config=None``, or it installs handlers of its own
    that bypass these."""
    path = log_file(Path(settings.log_path), component)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        handler = JsonLinesFile(
            path, settings.log_max_bytes, settings.log_backup_count, settings.log_fsync_interval_s
        )
    except OSError as e:
        raise ConfigError(
            f"cannot write the log file {path}: {e.strerror} (setting log_dir, default "
            "data_dir/logs)"
        ) from None
    handler.setFormatter(JsonFormatter())
    handlers: list[logging.Handler] = [handler]
    if settings.log_stderr_format != "off":
        err = logging.StreamHandler(sys.stderr)
        err.setFormatter(
            JsonFormatter() if settings.log_stderr_format == "json" else TextFormatter()
        )
        handlers.append(err)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "sandhold_logs", False)]:
        root.removeHandler(old)
        old.close()
    level = logging.getLevelName(settings.log_level)
    root.setLevel(level)
    for h in handlers:
        h.setLevel(level)
        h.sandhold_logs = True  # type: ignore[attr-defined]
        root.addHandler(h)
    for name in UVICORN:
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    return path


__all__ = ["ID_FIELDS", "JsonFormatter", "JsonLinesFile", "TextFormatter", "log_file", "setup"]
