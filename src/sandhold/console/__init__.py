"""The operator console: a web page served by ``sandhold gateway serve`` (sessions, timelines,
usage and failures by tenant and scenario, live sandboxes) and by ``sandhold serve`` (live
sandboxes), behind the admin key or a tenant key. ``web`` serves the page and the API's
plumbing; ``server`` and ``gateway`` answer its queries. See docs/console.md."""
