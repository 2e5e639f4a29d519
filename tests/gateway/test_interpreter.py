"""`run_code` through the gateway on a tenant whose template has the code interpreter: state kept
across calls and rich results (a chart) come back, not just stdout."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from sandhold.config import Settings
from sandhold.interpreter.template import build_code_interpreter_template
from sandhold.runtime.templates.store import TemplateStore
from tests.support.gateway_server import Gateway, tool
from tests.support.interpreter import CACHE_DIR

KEY = "interp-tenant-key-0123456789"


def test_run_code_returns_rich_results(make_gateway: Callable[..., Gateway]) -> None:
    gw = make_gateway("local")
    store = TemplateStore(gw.data_dir / "templates", Settings(data_dir=gw.data_dir).uid_base)
    build_code_interpreter_template(store, cache_dir=CACHE_DIR)
    with gw.admin() as admin:
        policy = {"template": "code-interpreter-v1", "keep_alive_s": 300}
        r = admin.put("/v1/admin/tenants/lab", json={"api_key": KEY, "policy": policy})
        assert r.status_code == 200, r.text
    with gw.client(KEY) as c:
        c.timeout = httpx.Timeout(120)
        r = tool(c, "analysis", "run_code", code="import pandas as pd\n"
                 "df = pd.DataFrame({'x': [1, 2, 3], 'y': [3, 1, 2]})")  # fmt: skip
        assert r["interpreter"] is True and r["error"] is None
        r = tool(c, "analysis", "run_code", code="df['y'].sum()")
        assert r["results"][0]["text"] in ("6", "np.int64(6)")
        r = tool(c, "analysis", "run_code", code="import matplotlib.pyplot as plt\n"
                 "plt.bar(['a', 'b'], [1, 2]); plt.title('t'); plt.show()")  # fmt: skip
        (chart,) = r["results"]
        assert chart["png"] and chart["chart"]["type"] == "bar"
        assert chart["chart"]["title"] == "t"
        r = tool(c, "analysis", "run_code", code="1/0")
        assert r["error"]["name"] == "ZeroDivisionError"
