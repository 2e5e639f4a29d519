from tests.egress.fixtures import (  # noqa: F401
    egress_runtime,
    egress_sandbox,
    egress_settings,
    internet,
    secret_store,
)
