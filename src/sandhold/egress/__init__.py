"""Egress: the only way out of a sandbox.

A sandbox's network namespace holds nothing but ``lo``; its agent forwards ``127.0.0.1:3128``
(HTTP proxy) and ``127.0.0.1:53`` (DNS) to a unix socket the host's egress daemon listens on,
one socket per sandbox, bind-mounted into it. The daemon enforces the sandbox's policy
(``policy``), answers DNS itself (``dns``, ``resolver``), injects tenant secrets into HTTPS
requests to hosts that have an injection rule (``secrets``, ``ca``) and records every request
(``audit``). See docs/egress.md.
"""
