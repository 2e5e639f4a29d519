"""The sandbox service: the protocol-neutral core between the runtime and every surface.

Typed requests in (``CreateSandbox``), typed records out (``Sandbox``), errors only from the one
tree (``sandhold.errors``), no HTTP. The E2B server (``sandhold.e2b``) and the gateway's local
provider are thin translators over it. It owns the lifecycle timers (end times, auto-pause,
auto-resume), the per-sandbox locks and the metadata keys, and it is the one place that moves
the (synchronous) runtime's work off the event loop.

Modules:

- ``builds.py``: Template builds for a team (what E2B's ``Template.build`` drives)
- ``fleet.py``: What a sandbox carries of the fleet: the id and generation its edge gave it
- ``fleet_templates.py``: Templates in the fleet's shared store: published by their maker,
  fetched on first use
- ``fleet_jobs.py``: A fleet host's own work: storing paused sandboxes, adopting, draining
- ``forks.py``: Fork through the service
- ``limits.py``: The bounds of a create, checked before anything is made
- ``locks.py``: Per-key asyncio locks that do not pile up
- ``metadata.py``: Metadata keys with a meaning beyond labels
- ``metrics.py``: Metrics samples of sandboxes, and the count of sandboxes that failed
- ``migration.py``: A paused sandbox kept in the fleet's shared store, taken up by any host
- ``offload.py``: ``Offload``: the one thread pool that moves the runtime's work off the event
  loop, handed to each part that calls the runtime
- ``pooler.py``: Keeping the pools of sandboxes booted ahead (runtime/pool.py) filled to
  ``pool_sizes``
- ``prom.py``: Prometheus metrics of ``sandhold serve`` (``GET /metrics``)
- ``readiness.py``: Readiness (``GET /ready``): whether this server can create a sandbox now
- ``records.py``: The service's typed requests and records
- ``service.py``: ``SandboxService``: create, connect/resume, pause, kill, list, timeouts
- ``snapshots.py``: Snapshots through the service
- ``suspender.py``: Suspend to disk, on a timer
- ``template_listing.py``: E2B's read-only views of templates, as a team sees them: * ``GET
  /templates``
- ``template_sync.py``: Keeping a fleet host's templates and the fleet's store in step
- ``timers.py``: The timer: every ``interval_s`` it expires each running sandbox whose stored end
  time has
- ``uploads.py``: A template build's uploaded COPY files, kept per team
- ``warmer.py``: Keeping the checkpoints of templates that start warm (runtime/checkpoint/warm.py)
"""

from sandhold.service.records import CreateSandbox, Lifecycle, Mount, Sandbox
from sandhold.service.service import SandboxService

__all__ = ["CreateSandbox", "Lifecycle", "Mount", "Sandbox", "SandboxService"]
