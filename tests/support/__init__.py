"""Helpers of the tests, shared by a package's test modules and its fixtures or by several
packages (conftest files hold fixtures only, and nothing imports from them).

- ``agent.py``: the agent as a real process, as a sandbox starts it (``start_agent``,
  ``AgentHandle``)
- ``e2b_server.py``: a real `sandhold serve` process (``new_server``, ``Server``, the teams' keys)
- ``gateway_server.py``: a real `sandhold gateway serve` process (``Gateway``), its keys, ``tool``
- ``guest.py``: a cgroup-v2-only stock kernel under QEMU, running a command on this machine's
  root (``run``, ``kit``)
- ``http.py``: raw HTTP requests over a socket, for what an HTTP client would not send
- ``interpreter.py``: `sandhold serve` with the code-interpreter template
  (``InterpreterServer``, ``CACHE_DIR``, ``API_KEY``)
- ``sandboxes.py``: sandboxes of the runtime in the tests' process (``SandboxFactory``)
- ``tunnel.py``: the tunnel tests' private network (``World``), ``create_tunnel``, ``stop``
- ``worker.py``: `sandhold worker` processes (``Worker``), ``sandbox_of``, ``text_of``,
  ``workspace``
"""
