"""The host side of the agent hop: the one envd client (``client``), over the transports a
sandbox can be reached by (``transports``: its agent's unix socket, a CONNECT tunnel through
it, a remote E2B endpoint), and the ports and version every surface names.

The in-sandbox agent (``sandhold.agent``) is the server side and imports none of this:
it is standard-library only.

Modules:

- ``client.py``: The one envd client of the host side
- ``framing.py``: Connect's streaming framing
- ``transports.py``: How the host reaches a port inside a sandbox
"""

ENVD_PORT = 49983  # envd: processes and files, served by the agent on its unix socket
INTERPRETER_PORT = 49999  # the code interpreter's HTTP service inside code-interpreter templates
ENVD_VERSION = "0.6.13"  # the envd version the agent speaks (the SDK gates features on it)
