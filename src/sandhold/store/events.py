"""The store's queries of what sessions leave behind: deliverables and the timeline's events
(a part of ``Store``, db.py)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Engine, select
from sqlalchemy.orm import Session as OrmSession
from sqlalchemy.orm import sessionmaker

from sandhold.store import statements as q
from sandhold.store.models import Deliverable, Event


class EventQueries:
    engine: Engine
    db: sessionmaker[OrmSession]

    def hot(self) -> contextlib.AbstractContextManager[Connection]:
        raise NotImplementedError  # Store's

    # -- deliverables ---------------------------------------------------------------------------
    def add_deliverable(self, **fields: Any) -> Deliverable:
        with self.db.begin() as db:
            d = Deliverable(**fields)
            db.add(d)
            return d

    def get_deliverable(self, tenant_id: str, deliverable_id: str) -> Deliverable | None:
        with self.db() as db:
            d = db.get(Deliverable, deliverable_id)
            return d if d is not None and d.tenant_id == tenant_id else None

    def deliverables(self, tenant_id: str, session_id: str) -> list[Deliverable]:
        with self.db() as db:
            return list(
                db.scalars(
                    select(Deliverable)
                    .where(Deliverable.tenant_id == tenant_id, Deliverable.session_id == session_id)
                    .order_by(Deliverable.created_at)
                )
            )

    # -- timeline -------------------------------------------------------------------------------
    def add_event(self, **fields: Any) -> None:
        fields.setdefault("at", time.time())
        with self.hot() as conn:
            q.add_events(conn, [fields])

    def add_events(self, events: Sequence[dict[str, Any]]) -> None:
        if events:
            with self.engine.begin() as conn:
                q.add_events(conn, events)

    def timeline(self, tenant_id: str, session_id: str, limit: int = 1000) -> list[Event]:
        with self.db() as db:
            return list(
                db.scalars(
                    select(Event)
                    .where(Event.tenant_id == tenant_id, Event.session_id == session_id)
                    .order_by(Event.id)
                    .limit(limit)
                )
            )

    def events(self, kind: str | None = None) -> list[Event]:
        q = select(Event).order_by(Event.id)
        if kind is not None:
            q = q.where(Event.kind == kind)
        with self.db() as db:
            return list(db.scalars(q))
