"""Providers: the adaptation layer between the gateway and whatever runs sandboxes.

Modules:

- ``base.py``: The provider interface: what the gateway needs from a sandbox backend
- ``channels.py``: Pooled HTTP clients to the sandboxes of this host, one per sandbox and port
- ``e2b.py``: The ``e2b`` provider: any E2B-compatible endpoint over plain HTTP (httpx)
- ``local.py``: The ``local`` provider: the sandbox service in this process
"""

from __future__ import annotations

from sandhold.config import Settings
from sandhold.gateway.providers.base import Provider


def make_provider(settings: Settings) -> Provider:
    if settings.gateway_provider == "local":
        from sandhold.gateway.providers.local import LocalProvider

        return LocalProvider(settings)
    from sandhold.gateway.providers.e2b import E2bProvider

    return E2bProvider(settings)
