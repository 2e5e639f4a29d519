"""An E2B-compatible server over the local runtime: the official ``e2b`` SDKs, pointed at it with
``E2B_API_URL``/``E2B_SANDBOX_URL``, drive local sandboxes exactly as they drive E2B cloud.

Modules:

- ``agent_conns.py``: Kept-alive connections from the data plane to the sandboxes' agents (envd's
  port only)
- ``app.py``: One ASGI application for both planes
- ``auth.py``: Who may do what: API keys map to teams on the control plane
- ``connect_stream.py``: Connect's streamed framing as the data plane meets it
- ``control.py``: The control plane: E2B's REST API (v2 and the v1 forms), translated to the sandbox
  service
- ``creates.py``: A create on the E2B surface (``NewSandbox``) as a service request
  (``CreateSandbox``)
- ``errors.py``: The E2B wire table: what each leaf of the error tree
- ``file_audit.py``: The file-API audit: every file operation that reaches a sandbox through the
  data plane
- ``fleet_host.py``: A fleet host's side of the edge's protocol: admission, fencing, ``/fleet``
- ``forks.py``: ``POST /sandboxes/{id}/fork``
- ``models.py``: Request bodies and query parameters of the E2B control plane
- ``network.py``: E2B's egress options mapped to the runtime's ``NetworkPolicy``
- ``proxy.py``: The data plane: authorize a request for a sandbox and stream it to the sandbox's
  agent
- ``sandbox_logs.py``: E2B's sandbox logs (``e2b sandbox logs``), from the sandbox's own log
- ``secrets.py``: E2B's ``/secrets``: a team's named values for its sandboxes' ``network.rules``
- ``server.py``: Running the E2B-compatible server under uvicorn (``sandhold serve``)
- ``snapshots.py``: E2B's snapshot endpoints over the service's snapshots (service/snapshots.py)
- ``templates.py``: E2B's template-build endpoints over the service's builds (service/builds.py)
- ``volumes.py``: Volumes: named host directories
- ``wire.py``: Service records as E2B's JSON
"""
