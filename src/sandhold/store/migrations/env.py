"""Alembic environment: migrations run from ``Store.migrate`` with its connection."""

from __future__ import annotations

from alembic import context

from sandhold.store.models import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
