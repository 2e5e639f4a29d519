"""Sandboxes of the runtime in the tests' own process: ``SandboxFactory`` creates them from
spec keywords for one test (the ``make_sandbox`` fixture of tests/conftest.py, the egress
fixtures) and kills whatever is left of them afterwards."""

from __future__ import annotations

from sandhold.runtime.runtime import Runtime, SandboxInfo
from sandhold.runtime.spec import SandboxSpec


class SandboxFactory:
    """Creates sandboxes for one test and kills whatever is left of them afterwards."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.created: list[str] = []

    async def __call__(self, **spec: object) -> SandboxInfo:
        info = self.runtime.create(SandboxSpec.model_validate(spec))
        self.created.append(info.id)
        return info

    async def cleanup(self) -> None:
        for sid in self.created:
            try:
                self.runtime.kill(sid)
            except Exception:
                pass
