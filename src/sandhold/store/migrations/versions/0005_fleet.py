"""The fleet's catalog (docs/fleet.md): its hosts, and which host holds each sandbox at which
generation.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fleet_hosts",
        sa.Column("host_id", sa.String(64), primary_key=True),
        sa.Column("address", sa.String(256), nullable=False),
        sa.Column("boot_id", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("capacity", sa.Integer, nullable=False),
        sa.Column("info", sa.JSON, nullable=False),
        sa.Column("last_seen", sa.Float, nullable=False),
    )
    op.create_table(
        "fleet_sandboxes",
        sa.Column("sandbox_id", sa.String(64), primary_key=True),
        sa.Column("team", sa.String(64), nullable=False),
        sa.Column("host_id", sa.String(64)),
        sa.Column("generation", sa.Integer, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("stored", sa.Boolean, nullable=False),
        sa.Column("listed", sa.JSON, nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_index("ix_fleet_sandboxes_host_id", "fleet_sandboxes", ["host_id"])
    op.create_index("ix_fleet_sandboxes_team_started", "fleet_sandboxes", ["team", "started_at"])


def downgrade() -> None:
    op.drop_index("ix_fleet_sandboxes_team_started", "fleet_sandboxes")
    op.drop_index("ix_fleet_sandboxes_host_id", "fleet_sandboxes")
    op.drop_table("fleet_sandboxes")
    op.drop_table("fleet_hosts")
