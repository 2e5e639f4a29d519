"""Tables of the gateway store."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    # sha256 of the tenant's API key: the key itself is never stored
    api_key_sha256: Mapped[str | None] = mapped_column(String(64), unique=True)
    policy: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class Session(Base):
    """One agent session (the platform's conversation id) and the sandbox it has right now.

    ``lock_owner``/``lock_until`` is a lease lock taken around every change of ``sandbox_id``
    (create, adopt, reclaim, close): whoever holds it may change the session's sandbox, and every
    write made under it is fenced with ``WHERE lock_owner = <token>``.
    """

    __tablename__ = "sessions"
    __table_args__ = (UniqueConstraint("tenant_id", "session_id", name="uq_session_tenant"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    session_id: Mapped[str] = mapped_column(String(128))
    state: Mapped[str] = mapped_column(String(16), default="open")  # open | closed
    sandbox_id: Mapped[str | None] = mapped_column(String(64), index=True)
    # what the provider returned at create (tokens it gives only once, e.g. traffic tokens)
    sandbox_handle: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    generation: Mapped[int] = mapped_column(Integer, default=0)  # sandboxes the session had
    # endAt of the last pause recorded in the timeline, so that replicas record it once
    recorded_pause_end_at: Mapped[float | None] = mapped_column(Float)
    lock_owner: Mapped[str | None] = mapped_column(String(80))
    lock_until: Mapped[float | None] = mapped_column(Float)
    # a slot of the tenant's max_live_sandboxes held for a create in flight (store.reserve_create)
    create_reserved_until: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[float] = mapped_column(Float)
    closed_at: Mapped[float | None] = mapped_column(Float)
    scenario: Mapped[str | None] = mapped_column(String(64))  # the platform's label (console)


class SessionUse(Base):
    """A tool call in flight on a session's sandbox. The reclaimer never kills a sandbox whose
    session has a live use; a use whose replica died simply expires."""

    __tablename__ = "session_uses"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    session_pk: Mapped[int] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"))
    sandbox_id: Mapped[str] = mapped_column(String(64))
    replica: Mapped[str] = mapped_column(String(64))
    tool: Mapped[str] = mapped_column(String(32))
    started_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)

    __table_args__ = (Index("ix_session_uses_session", "session_pk", "expires_at"),)


class Deliverable(Base):
    __tablename__ = "deliverables"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    session_id: Mapped[str] = mapped_column(String(128))
    name: Mapped[str] = mapped_column(String(255))
    source_path: Mapped[str] = mapped_column(Text)
    size: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    storage: Mapped[str] = mapped_column(String(16))  # local | s3
    key: Mapped[str] = mapped_column(Text)
    url: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)


# The kinds that start and stop a sandbox span (tally.py's STARTS and STOPS), spelled out for
# the partial index below: its predicate and a query's must read alike for the planner to use it.
LIFECYCLE_SQL = (
    "kind IN ('sandbox_created', 'sandbox_adopted', 'sandbox_resumed', 'sandbox_paused', "
    "'sandbox_reclaimed', 'sandbox_replaced', 'sandbox_failed', 'sandbox_orphan_killed', "
    "'sandbox_killed', 'session_closed')"
)


class Event(Base):
    """The timeline: one row per thing that happened to a session."""

    __tablename__ = "events"
    __table_args__ = (
        Index("ix_events_session", "tenant_id", "session_id", "id"),
        Index("ix_events_tenant_kind", "tenant_id", "kind"),
        Index("ix_events_at", "at"),
        # a session's sandbox state at a moment (rollups.py): its last start or stop before it
        Index(
            "ix_events_lifecycle",
            "tenant_id",
            "session_id",
            "at",
            "id",
            sqlite_where=text(LIFECYCLE_SQL),
            postgresql_where=text(LIFECYCLE_SQL),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float)
    tenant_id: Mapped[str] = mapped_column(String(64))
    session_id: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(32))
    sandbox_id: Mapped[str | None] = mapped_column(String(64))
    tool: Mapped[str | None] = mapped_column(String(32))
    duration_ms: Mapped[float | None] = mapped_column(Float)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    bytes_in: Mapped[int | None] = mapped_column(Integer)
    bytes_out: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    reason: Mapped[str | None] = mapped_column(Text)
    provider_state: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    replica: Mapped[str | None] = mapped_column(String(64))
    # a tool call's input and output heads, {input, stdout, stderr, cut}: gateway/texts.py
    texts: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class EventRollup(Base):
    """The timeline summed per hour (``span_s`` 3600) and per UTC day (86400) by tenant and
    scenario (``''``: none), written by the rollup job (rollups.py, tally.py): events, tool
    calls, failures by class, a sparse latency histogram, and the seconds the sandboxes ran and
    stayed paused within it."""

    __tablename__ = "event_rollups"

    span_s: Mapped[int] = mapped_column(Integer, primary_key=True)
    start_at: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # epoch s, UTC-aligned
    tenant_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    scenario: Mapped[str] = mapped_column(String(64), primary_key=True)
    events: Mapped[int] = mapped_column(Integer)
    tool_calls: Mapped[int] = mapped_column(Integer)
    failures: Mapped[int] = mapped_column(Integer)
    failure_classes: Mapped[dict[str, int]] = mapped_column(JSON)
    latency: Mapped[dict[str, int]] = mapped_column(JSON)  # tally.latency_key -> tool calls
    running_s: Mapped[float] = mapped_column(Float)
    paused_s: Mapped[float] = mapped_column(Float)


class EventRollupMark(Base):
    """The rollup job's watermark (one row): hours from ``first_hour`` to ``last_hour`` are
    rolled up, from the events up to id ``seen_event_id``. Each hour moves it with a
    compare-and-swap, in the transaction of its rows; a later event of a rolled-up hour moves
    it back to that hour."""

    __tablename__ = "event_rollup_mark"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)  # always 1
    first_hour: Mapped[int] = mapped_column(BigInteger)
    last_hour: Mapped[int] = mapped_column(BigInteger)
    seen_event_id: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[float] = mapped_column(Float)


class Tunnel(Base):
    """An MCP tunnel of a tenant (docs/tunnel.md): a connector inside a private network polls
    for the MCP requests of its tools. Its token is kept as a sha256 (what authenticates) and
    sealed under the secrets key ring (what ``reveal`` opens), never in the clear."""

    __tablename__ = "tunnels"
    __table_args__ = (UniqueConstraint("tenant_id", "name", name="uq_tunnel_tenant_name"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # tunnel_<32 hex>
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(32))
    description: Mapped[str] = mapped_column(Text, default="")
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    token_sealed: Mapped[dict[str, Any]] = mapped_column(JSON)  # {key, nonce, data}
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class TunnelConnector(Base):
    """A connector process (its instance id) seen polling a tunnel, and when it last was: a
    request held by one that stopped polling fails instead of waiting for its deadline."""

    __tablename__ = "tunnel_connectors"

    tunnel_id: Mapped[str] = mapped_column(
        ForeignKey("tunnels.id", ondelete="CASCADE"), primary_key=True
    )
    instance_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    client_name: Mapped[str | None] = mapped_column(String(64))
    client_version: Mapped[str | None] = mapped_column(String(64))
    channels: Mapped[list[str] | None] = mapped_column(JSON)
    replica: Mapped[str | None] = mapped_column(String(64))
    first_seen_at: Mapped[float] = mapped_column(Float)
    last_seen_at: Mapped[float] = mapped_column(Float)


class TunnelRequest(Base):
    """An MCP request relayed through a tunnel: queued by the replica a tool call reached,
    claimed by the replica a connector polls, answered through any replica (the store carries
    it between them). ``state``: pending | delivered | done | failed."""

    __tablename__ = "tunnel_requests"
    __table_args__ = (
        Index("ix_tunnel_requests_queue", "tunnel_id", "state", "created_at"),
        Index("ix_tunnel_requests_expires", "expires_at"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tunnel_id: Mapped[str] = mapped_column(ForeignKey("tunnels.id", ondelete="CASCADE"))
    channel: Mapped[str] = mapped_column(String(64))
    method: Mapped[str] = mapped_column(String(64))
    payload: Mapped[str] = mapped_column(Text)  # {"jsonrpc": ..., "headers": ...}
    state: Mapped[str] = mapped_column(String(16))
    shard_token: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)
    delivered_to: Mapped[str | None] = mapped_column(String(64))
    delivered_at: Mapped[float | None] = mapped_column(Float)
    response: Mapped[str | None] = mapped_column(Text)  # the connector's response body
    responded_at: Mapped[float | None] = mapped_column(Float)


class FleetHost(Base):
    """A fleet host as the edges see it (docs/fleet.md): what its last answer said."""

    __tablename__ = "fleet_hosts"

    host_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    address: Mapped[str] = mapped_column(String(256))  # its base URL
    boot_id: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))  # ready | draining | lost
    capacity: Mapped[int] = mapped_column(Integer)
    info: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # its /fleet/info
    last_seen: Mapped[float] = mapped_column(Float)


class FleetSandbox(Base):
    """Where a sandbox of the fleet is. ``generation`` grows with every placement and move, and
    every change is a compare-and-set on it, so only one host's copy is ever the sandbox.
    ``host_id`` is NULL for a paused sandbox that lives only in the shared store."""

    __tablename__ = "fleet_sandboxes"
    __table_args__ = (Index("ix_fleet_sandboxes_team_started", "team", "started_at"),)

    sandbox_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    team: Mapped[str] = mapped_column(String(64))
    host_id: Mapped[str | None] = mapped_column(String(64), index=True)
    generation: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))  # running | paused | moving
    stored: Mapped[bool] = mapped_column(Boolean, default=False)  # a copy in the shared store
    listed: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # E2B's ListedSandbox
    started_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
