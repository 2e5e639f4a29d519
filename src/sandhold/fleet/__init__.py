"""The fleet (docs/fleet.md): many ``sandhold serve`` hosts behind the edge, which places each
sandbox on a host, keeps where it is in a shared catalog and routes every call to it.

- ``catalog.py``: the catalog (which host holds each sandbox, at which generation).
- ``discovery.py``: where the hosts are (a headless Service's DNS, or a static list).
- ``edge.py``: the edge's E2B API and data plane (``sandhold edge serve``).
- ``hop.py``: whole requests from the edge to a host, over its kept connections.
- ``listing.py``: the edge's listing, from the catalog.
- ``members.py``: what each host last said, polled by every edge; lost hosts.
- ``metrics.py``: the edge's Prometheus metrics.
- ``moves.py``: sandboxes in the store only, taken up by a host when a call needs them.
- ``placement.py``: which host takes a create.
"""
