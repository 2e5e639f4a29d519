"""The code interpreter: E2B's port-49999 service (Jupyter-style stateful execution of Python,
JavaScript and bash, with rich results and chart data) and the ``code-interpreter-v1`` template
that carries it.

``server`` and the modules it imports run *inside* the sandbox and depend only on the template's
packages; ``template`` runs on the host.

Modules:

- ``bash_context.py``: Bash contexts: one persistent ``bash`` per context
- ``charts.py``: Structured chart data (MIME ``e2b/chart``) for matplotlib figures, inside the
  kernel
- ``contexts.py``: Execution contexts: one stateful interpreter each
- ``java_context.py``: Java contexts: one JShell per context
- ``kernel_launcher.py``: Starts an IPython kernel, like ``python -m ipykernel_launcher``, adapted
  to the sandbox
- ``kernel_startup.py``: Runs inside every Python kernel at start
- ``node_context.py``: JavaScript contexts: one persistent node process each, running
  ``js_runner.js``
- ``outputs.py``: The NDJSON lines of ``POST /execute``, exactly as the e2b-code-interpreter SDK
  parses them
- ``packages.py``: Every Python package of the ``code-interpreter-v1`` template, pinned,
  dependencies included
- ``process_context.py``: Contexts backed by one long-lived child process (node, bash)
- ``python_kernel.py``: Python contexts: a real IPython kernel (ipykernel) per context, driven with
  jupyter_client
- ``r_kernel.py``: R contexts: IRkernel (Debian's r-cran-irkernel) driven as the Python kernel is
- ``server.py``: The code-interpreter service
- ``template.py``: Building the ``code-interpreter-v1`` template
"""
