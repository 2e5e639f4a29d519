"""MCP tunnels (docs/tunnel.md): a tenant's tunnels with their sealed tokens, the connectors
seen polling them, and the requests relayed through them (the store carries a request from the
replica a tool call reached to the replica its connector polls).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tunnels",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("tenant_id", sa.String(64), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("name", sa.String(32), nullable=False),
        sa.Column("description", sa.Text, nullable=False),
        sa.Column("token_sha256", sa.String(64), nullable=False),
        sa.Column("token_sealed", sa.JSON, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.UniqueConstraint("tenant_id", "name", name="uq_tunnel_tenant_name"),
        sa.UniqueConstraint("token_sha256"),
    )
    op.create_index("ix_tunnels_tenant_id", "tunnels", ["tenant_id"])
    op.create_table(
        "tunnel_connectors",
        sa.Column(
            "tunnel_id",
            sa.String(64),
            sa.ForeignKey("tunnels.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("instance_id", sa.String(64), primary_key=True),
        sa.Column("client_name", sa.String(64)),
        sa.Column("client_version", sa.String(64)),
        sa.Column("channels", sa.JSON),
        sa.Column("replica", sa.String(64)),
        sa.Column("first_seen_at", sa.Float, nullable=False),
        sa.Column("last_seen_at", sa.Float, nullable=False),
    )
    op.create_table(
        "tunnel_requests",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column(
            "tunnel_id",
            sa.String(64),
            sa.ForeignKey("tunnels.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("channel", sa.String(64), nullable=False),
        sa.Column("method", sa.String(64), nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("shard_token", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("delivered_to", sa.String(64)),
        sa.Column("delivered_at", sa.Float),
        sa.Column("response", sa.Text),
        sa.Column("responded_at", sa.Float),
        sa.UniqueConstraint("shard_token"),
    )
    op.create_index(
        "ix_tunnel_requests_queue", "tunnel_requests", ["tunnel_id", "state", "created_at"]
    )
    op.create_index("ix_tunnel_requests_expires", "tunnel_requests", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_tunnel_requests_expires", "tunnel_requests")
    op.drop_index("ix_tunnel_requests_queue", "tunnel_requests")
    op.drop_table("tunnel_requests")
    op.drop_table("tunnel_connectors")
    op.drop_index("ix_tunnels_tenant_id", "tunnels")
    op.drop_table("tunnels")
