"""What a tool call ran and printed, for the console's timeline: ``events.texts`` holds the
call's input (command, code or path) and the head of its stdout and stderr, each bounded by
``gateway_timeline_text_bytes``.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.add_column(sa.Column("texts", sa.JSON))


def downgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.drop_column("texts")
