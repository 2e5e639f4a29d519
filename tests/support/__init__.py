"""Helpers shared by the tests of several packages (conftest files hold fixtures only).

- ``http.py``: raw HTTP requests over a socket, for what an HTTP client would not send
"""
