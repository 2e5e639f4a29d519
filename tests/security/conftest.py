"""Fixtures of the network and credential attack tests (the egress test internet)."""

from tests.egress.fixtures import (  # noqa: F401
    egress_runtime,
    egress_sandbox,
    egress_settings,
    internet,
    secret_store,
)
