"""Create reservations: a session about to create a sandbox holds a slot of its tenant's
``max_live_sandboxes`` until the sandbox is recorded (or the reservation expires).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("create_reserved_until", sa.Float))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("create_reserved_until")
