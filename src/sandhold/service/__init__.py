"""The sandbox service: the protocol-neutral core between the runtime and every surface.

Typed requests in (``CreateSandbox``), typed records out (``Sandbox``), errors only from the one
tree (``sandhold.errors``), no HTTP. The E2B server (``sandhold.e2b``) and the gateway's local
provider are thin translators over it. It owns the lifecycle timers (end times, auto-pause,
auto-resume), the per-sandbox locks and the metadata keys, and it is the one place that moves
the (synchronous) runtime's work off the event loop.
"""

from sandhold.service.records import CreateSandbox, Lifecycle, Mount, Sandbox
from sandhold.service.service import SandboxService

__all__ = ["CreateSandbox", "Lifecycle", "Mount", "Sandbox", "SandboxService"]
