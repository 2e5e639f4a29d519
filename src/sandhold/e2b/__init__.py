"""An E2B-compatible server over the local runtime: the official ``e2b`` SDKs, pointed at it with
``E2B_API_URL``/``E2B_SANDBOX_URL``, drive local sandboxes exactly as they drive E2B cloud."""
