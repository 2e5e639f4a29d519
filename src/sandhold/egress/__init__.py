"""Egress: the only way out of a sandbox.

A sandbox's network namespace holds nothing but ``lo``; its agent forwards ``127.0.0.1:3128``
(HTTP proxy) and ``127.0.0.1:53`` (DNS) to a unix socket the host's egress daemon listens on,
one socket per sandbox, bind-mounted into it. The daemon enforces the sandbox's policy
(``policy``), answers DNS itself (``dns``, ``resolver``), injects tenant secrets into HTTPS
requests to hosts that have an injection rule (``secrets``, ``ca``) and records every request
(``audit``). See docs/egress.md.

Modules:

- ``ca.py``: The deployment's egress CA
- ``config.py``: The egress daemon's configuration
- ``connection.py``: What every path of the egress proxy works with
- ``control.py``: The runtime's side of egress
- ``daemon.py``: The per-host egress daemon: one asyncio process per data dir, serving every
  sandbox's socket
- ``decoding.py``: Content codings of responses the proxy scans
- ``dns.py``: The little of the DNS wire format the egress path needs (RFC 1035)
- ``dns_query.py``: ``POST /dns-query``: a DNS question (RFC 8484 message) relayed by the agent's
  DNS stub
- ``forward.py``: HTTP forwarding, one request at a time
- ``header_rules.py``: A sandbox's header rules, E2B's ``network.rules``
- ``http_parts.py``: The parts of HTTP requests the egress proxy reads itself (h11 does the framing)
- ``intercept.py``: A ``CONNECT`` tunnel to a host with a credential rule
- ``kms.py``: The secrets key ring wrapped by a key-management service (AWS KMS's API)
- ``policy.py``: Egress rules and the decision the proxy takes for each connection
- ``proxy.py``: One sandbox's egress proxy: what the daemon runs for each connection on a sandbox's
  socket
- ``refusal.py``: How the egress proxy says no
- ``resolver.py``: Name resolution on the host, for the proxy
- ``response.py``: The way back: an upstream's response
- ``scan.py``: What the egress proxy looks for in everything an upstream sends back toward a sandbox
- ``secret_values.py``: E2B's secrets (``/secrets``)
- ``secrets.py``: Tenant credentials in custody of the control plane
- ``tunnel.py``: A ``CONNECT`` tunnel to a host without a credential rule
"""
