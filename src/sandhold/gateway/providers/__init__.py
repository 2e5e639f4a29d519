"""Providers: the adaptation layer between the gateway and whatever runs sandboxes."""

from __future__ import annotations

from sandhold.config import Settings
from sandhold.gateway.providers.base import Provider


def make_provider(settings: Settings) -> Provider:
    if settings.gateway_provider == "local":
        from sandhold.gateway.providers.local import LocalProvider

        return LocalProvider(settings)
    from sandhold.gateway.providers.e2b import E2bProvider

    return E2bProvider(settings)
