"""The e2b provider's inbound table (providers/e2b.py ``INBOUND``, ``raise_for``): what an E2B
API's status means for each operation, the twin of the outbound E2B_STATUS. The provider's
behaviour against a real server is tests/gateway/test_provider_compliance.py's."""

from __future__ import annotations

import httpx
import pytest

from sandhold.errors import ProviderError
from sandhold.gateway.providers.e2b import INBOUND, raise_for


def answer(status: int, message: str = "the server's words") -> httpx.Response:
    return httpx.Response(status, json={"code": status, "message": message})


@pytest.mark.parametrize(
    ("op", "status", "leaf"),
    [(op, status, leaf) for op, table in INBOUND.items() for status, leaf in table.items()],
)
def test_each_meaningful_status_is_its_leaf(op: str, status: int, leaf: type) -> None:
    with pytest.raises(leaf, match="the server's words") as e:
        raise_for(answer(status), op, 200)
    assert type(e.value) is leaf


def test_an_expected_status_is_nothing_and_any_other_a_provider_error() -> None:
    raise_for(answer(204), "kill", 204)
    raise_for(answer(404), "set_timeout", 204, 404)
    with pytest.raises(ProviderError, match=r"^create failed \(409\): taken") as e:
        raise_for(answer(409, "taken"), "create", 201)  # (409 means something to others only)
    assert type(e.value) is ProviderError
    r = httpx.Response(502, text="<html>bad gateway</html>")
    with pytest.raises(ProviderError, match=r"list failed \(502\): <html>bad gateway"):
        raise_for(r, "list", 200)
