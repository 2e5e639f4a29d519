"""Helpers shared by the tests of several packages (conftest files hold fixtures only).

- ``e2b_server.py``: a real `sandhold serve` process (``new_server``, ``Server``, the teams' keys)
- ``gateway_server.py``: a real `sandhold gateway serve` process (``Gateway``), its keys, ``tool``
- ``http.py``: raw HTTP requests over a socket, for what an HTTP client would not send
"""
