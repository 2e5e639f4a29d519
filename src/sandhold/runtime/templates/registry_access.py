"""Which registries an image pull may reach, and which pulled images every team shares
(issue 27: no server-side request forgery, no private image leaking to another team).

A pull reaches only the registries the operator named: the default one
(``template_image_registry``, or skopeo's default when unset, for references naming no
registry) and ``template_image_registries``, matched as written (``host`` or ``host:port``); a
reference naming any other registry is refused (``allowed``) before any traffic. Then
``check_addresses``: a registry the operator wrote as an IP address is dialled as written; one
named by host name is resolved, and every address must pass the egress guard (policy.py
``Guard``: loopback, link-local, private ranges and this host's own addresses are refused)
unless it lies in ``template_image_open_cidrs``. skopeo's default registry is not resolved here
(no team names it; skopeo does). skopeo resolves the name again when it connects, and follows
the registry's redirects: both are the operator's registry's to give (docs/templates.md).

``shared``: an image pulled anonymously from a reference under ``template_image_public``
(default: ``template_image_registry``) is every team's; any other is usable only by the teams
that proved access (from_image.py).
"""

from __future__ import annotations

import ipaddress
import socket
from typing import TYPE_CHECKING

from sandhold.egress.policy import Guard, parse_ip
from sandhold.errors import InvalidRequest, TemplateBuildFailed
from sandhold.runtime.templates import oci

if TYPE_CHECKING:
    from sandhold.config import Settings


def _host(entry: str) -> str:
    """``host[:port]`` of a registry entry (``template_image_registry`` may carry a path)."""
    return entry.strip().split("/", 1)[0].lower()


def _split(domain: str) -> tuple[str, int | None]:
    host, sep, port = domain.rpartition(":")
    return (host, int(port)) if sep and port.isdigit() else (domain, None)


def allowed(settings: Settings) -> list[str]:
    """The registries pulls may reach, as the operator wrote them (skopeo's default: its name)."""
    default = settings.template_image_registry
    first = _host(default) if default else oci.DEFAULT_NAME
    rest = [_host(r) for r in settings.template_image_registries]
    return [first, *sorted(set(rest) - {first})]


def check_allowed(settings: Settings, domain: str | None) -> None:
    """InvalidRequest unless registry ``domain`` (None: the reference names none) is one the
    operator named."""
    default = settings.template_image_registry
    if domain is None and not default:
        return  # skopeo's default
    hosts = {_host(r) for r in settings.template_image_registries}
    if default:
        hosts.add(_host(default))
    if domain is not None and domain.lower() in hosts:
        return
    raise InvalidRequest(
        f"registry {domain or oci.DEFAULT_NAME} is not one this server pulls images from "
        f"(allowed: {', '.join(allowed(settings))}; template_image_registries)"
    )


def check_addresses(settings: Settings, domain: str | None) -> None:
    """Every address of registry ``domain`` (named by host name) passes the egress guard;
    TemplateBuildFailed (the words of any unreachable registry) if it does not resolve,
    InvalidRequest naming the address if one is internal."""
    if domain is None:
        return
    host, port = _split(domain)
    if parse_ip(host) is not None:
        return  # an address the operator wrote
    try:
        infos = socket.getaddrinfo(host, port or 443, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise TemplateBuildFailed(oci.unreachable(domain)) from None
    from sandhold.egress.daemon import host_addresses  # the daemon module is heavy

    guard = Guard(settings.template_image_open_cidrs, host_addresses())
    for info in infos:
        addr = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        why = guard.internal(addr)
        if why is not None:
            raise InvalidRequest(
                f"registry {domain} resolves to {addr}, {why}: not pulled from "
                "(template_image_open_cidrs opens a range)"
            )


def shared(settings: Settings, ref: oci.Reference, anonymous: bool) -> bool:
    """Whether an image pulled as ``ref`` is every team's: pulled anonymously from a registry
    or under a prefix the operator marked public."""
    if not anonymous or ref.domain is None:
        return False
    marks = settings.template_image_public
    if marks is None:
        marks = [settings.template_image_registry] if settings.template_image_registry else []
    name = ref.name.lower()
    return any(name.startswith(m.strip().strip("/").lower() + "/") for m in marks)
