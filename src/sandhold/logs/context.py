"""The ids a log record carries, bound per request (or per task) in a context variable.

``bind`` starts a new set of ids for the code it runs (a request, a background task); ``update``
fills in ids the code learns on the way (the sandbox of a create, a session). The ids are one
mutable object per binding, so what an inner function updates is seen by the middleware that
bound them, even across a task Starlette or anyio started in between (they copy the context, and
the copy holds the same object)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace

ID_FIELDS = ("request_id", "tenant", "session", "sandbox")


@dataclass(slots=True)
class Ids:
    request_id: str | None = None
    tenant: str | None = None
    session: str | None = None
    sandbox: str | None = None

    def public(self) -> dict[str, str]:
        """The ids that are set, by name."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}


_ids: contextvars.ContextVar[Ids | None] = contextvars.ContextVar("sandhold_log_ids", default=None)


def current() -> Ids | None:
    return _ids.get()


def bind(**ids: str | None) -> contextvars.Token[Ids | None]:
    """Bind a new set of ids (the current ones, with ``ids`` over them) until ``reset``."""
    _check(ids)
    return _ids.set(replace(_ids.get() or Ids(), **ids))


def reset(token: contextvars.Token[Ids | None]) -> None:
    _ids.reset(token)


@contextlib.contextmanager
def bound(**ids: str | None) -> Iterator[Ids]:
    """``bind`` for the block, e.g. ``with logs.bound(session=sid): ...``."""
    token = bind(**ids)
    try:
        yield _ids.get() or Ids()
    finally:
        _ids.reset(token)


def update(**ids: str | None) -> None:
    """Set ``ids`` on the current binding, where whoever bound it sees them too; binds them if
    nothing is bound. ``None`` leaves an id as it is."""
    _check(ids)
    cur = _ids.get()
    if cur is None:
        _ids.set(Ids(**ids))
        return
    for name, value in ids.items():
        if value is not None:
            setattr(cur, name, value)


def _check(ids: dict[str, str | None]) -> None:
    unknown = set(ids) - set(ID_FIELDS)
    if unknown:
        raise TypeError(f"unknown log ids {sorted(unknown)}; the ids are {ID_FIELDS}")
