"""Per-hour and per-day rollups of the timeline for the console's long ranges (store/rollups.py),
their watermark, and a partial index on the events that start and stop sandboxes (a session's
sandbox state at a moment is its last such event before it).

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# as store/models.py spells it (a migration keeps its own copy: the model may change later)
LIFECYCLE_SQL = (
    "kind IN ('sandbox_created', 'sandbox_adopted', 'sandbox_resumed', 'sandbox_paused', "
    "'sandbox_reclaimed', 'sandbox_replaced', 'sandbox_failed', 'sandbox_orphan_killed', "
    "'sandbox_killed', 'session_closed')"
)


def upgrade() -> None:
    op.create_table(
        "event_rollups",
        sa.Column("span_s", sa.Integer, primary_key=True),
        sa.Column("start_at", sa.BigInteger, primary_key=True),
        sa.Column("tenant_id", sa.String(64), primary_key=True),
        sa.Column("scenario", sa.String(64), primary_key=True),
        sa.Column("events", sa.Integer, nullable=False),
        sa.Column("tool_calls", sa.Integer, nullable=False),
        sa.Column("failures", sa.Integer, nullable=False),
        sa.Column("failure_classes", sa.JSON, nullable=False),
        sa.Column("latency", sa.JSON, nullable=False),
        sa.Column("running_s", sa.Float, nullable=False),
        sa.Column("paused_s", sa.Float, nullable=False),
    )
    op.create_table(
        "event_rollup_mark",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("first_hour", sa.BigInteger, nullable=False),
        sa.Column("last_hour", sa.BigInteger, nullable=False),
        sa.Column("seen_event_id", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_index(
        "ix_events_lifecycle",
        "events",
        ["tenant_id", "session_id", "at", "id"],
        sqlite_where=sa.text(LIFECYCLE_SQL),
        postgresql_where=sa.text(LIFECYCLE_SQL),
    )


def downgrade() -> None:
    op.drop_index("ix_events_lifecycle", "events")
    op.drop_table("event_rollup_mark")
    op.drop_table("event_rollups")
