"""A session's scenario: the label the platform gives it (``X-Sandhold-Scenario``), by which the
console groups usage and failures; events get an index on time for the console's ranges.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("scenario", sa.String(64)))
    op.create_index("ix_events_at", "events", ["at"])


def downgrade() -> None:
    op.drop_index("ix_events_at", "events")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("scenario")
