"""The code interpreter: E2B's port-49999 service (Jupyter-style stateful execution of Python,
JavaScript and bash, with rich results and chart data) and the ``code-interpreter-v1`` template
that carries it.

``server`` and the modules it imports run *inside* the sandbox and depend only on the template's
packages; ``template`` runs on the host.
"""
