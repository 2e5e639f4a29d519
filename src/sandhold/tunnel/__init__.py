"""MCP tunnels: a tenant's private MCP servers reached from its sessions through a connector that
dials out to the gateway (docs/tunnel.md).

Modules:

- ``client.py``: The gateway as an MCP client of the servers behind a tunnel
- ``connector.py``: ``sandhold tunnel connect``: the connector inside the private network
- ``connector_config.py``: The connector's configuration file (TOML; docs/tunnel.md has an example)
- ``doctor.py``: ``sandhold tunnel doctor``: why a connector cannot work, one line per problem and
  what to do
- ``registry.py``: A tenant's tunnels in the store, and their tokens
- ``relay.py``: Requests relayed through a tunnel, between replicas, by way of the store
- ``routes.py``: The gateway's tunnel endpoints
- ``tools.py``: A tenant's tunnel tools on the gateway's surfaces
- ``upstreams.py``: The internal MCP servers a connector relays to, one per channel
"""
