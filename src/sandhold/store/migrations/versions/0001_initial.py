"""The gateway store: tenants, sessions, session uses, deliverables, events.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("api_key_sha256", sa.String(64), unique=True),
        sa.Column("policy", sa.JSON, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_table(
        "sessions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("tenant_id", sa.String(64), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("sandbox_id", sa.String(64)),
        sa.Column("sandbox_handle", sa.JSON),
        sa.Column("generation", sa.Integer, nullable=False, server_default="0"),
        sa.Column("recorded_pause_end_at", sa.Float),
        sa.Column("lock_owner", sa.String(80)),
        sa.Column("lock_until", sa.Float),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("closed_at", sa.Float),
        sa.UniqueConstraint("tenant_id", "session_id", name="uq_session_tenant"),
    )
    op.create_index("ix_sessions_tenant_id", "sessions", ["tenant_id"])
    op.create_index("ix_sessions_sandbox_id", "sessions", ["sandbox_id"])
    op.create_table(
        "session_uses",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column(
            "session_pk",
            sa.Integer,
            sa.ForeignKey("sessions.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("sandbox_id", sa.String(64), nullable=False),
        sa.Column("replica", sa.String(64), nullable=False),
        sa.Column("tool", sa.String(32), nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
    )
    op.create_index("ix_session_uses_session", "session_uses", ["session_pk", "expires_at"])
    op.create_table(
        "deliverables",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("tenant_id", sa.String(64), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("source_path", sa.Text, nullable=False),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("storage", sa.String(16), nullable=False),
        sa.Column("key", sa.Text, nullable=False),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_deliverables_tenant_id", "deliverables", ["tenant_id"])
    op.create_table(
        "events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("sandbox_id", sa.String(64)),
        sa.Column("tool", sa.String(32)),
        sa.Column("duration_ms", sa.Float),
        sa.Column("exit_code", sa.Integer),
        sa.Column("bytes_in", sa.Integer),
        sa.Column("bytes_out", sa.Integer),
        sa.Column("error", sa.Text),
        sa.Column("reason", sa.Text),
        sa.Column("provider_state", sa.JSON),
        sa.Column("replica", sa.String(64)),
    )
    op.create_index("ix_events_session", "events", ["tenant_id", "session_id", "id"])
    op.create_index("ix_events_tenant_kind", "events", ["tenant_id", "kind"])


def downgrade() -> None:
    for table in ("events", "deliverables", "session_uses", "sessions", "tenants"):
        op.drop_table(table)
