"""The gateway's store: tenants, sessions, session locks and uses, deliverables, the timeline.

SQLAlchemy 2 models with Alembic migrations; a SQLite file by default, PostgreSQL for several
gateway replicas. It never holds lifecycle truth that the provider owns (sandbox state, endAt).

Modules:

- ``batch.py``: Set-based queries of the reclaimer
- ``db.py``: The store: migrations and every query the gateway makes (its engine: engine.py)
- ``engine.py``: The store's engine: SQLite's pragmas, PostgreSQL's pool and its check of idle
  connections
- ``events.py``: The queries of deliverables and the timeline's events (a part of ``Store``)
- ``models.py``: Tables of the gateway store
- ``rollups.py``: The timeline rolled up per hour (the job, with its watermark), and the reads
  that combine rollups with raw events
- ``schema.py``: Running the store's Alembic migrations, on SQLite and PostgreSQL alike
- ``statements.py``: The statements of a tool call's hot path, built once (SQLAlchemy Core, bound
  parameters)
- ``tally.py``: The tally of timeline events into usage cells, for the rollup job and raw reads
"""
