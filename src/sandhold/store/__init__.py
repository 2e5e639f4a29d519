"""The gateway's store: tenants, sessions, session locks and uses, deliverables, the timeline.

SQLAlchemy 2 models with Alembic migrations; a SQLite file by default, PostgreSQL for several
gateway replicas. It never holds lifecycle truth that the provider owns (sandbox state, endAt).
"""
