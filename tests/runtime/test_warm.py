"""Templates that start warm (runtime/checkpoint/warm.py): a checkpoint of a sandbox whose service
was ready, restored per create with the create's own identity and env; creates it cannot serve, and
a damaged checkpoint, boot cold."""

from __future__ import annotations

import json
import shutil

import pytest

from sandhold.errors import InvalidRequest
from sandhold.runtime.checkpoint import process_tree
from sandhold.runtime.runtime import Runtime
from tests.runtime.helpers import sh
from tests.runtime.test_suspend import _criu  # noqa: F401 (autouse)

NAME = "warm-svc"
PORT = 8123
# A service that remembers when it started and the env it was told (POST /env), and answers
# GET /ready once up: what a warm template's service looks like to the agent.
SERVICE = """
import http.server, json, os, time
started, told = time.time(), {}
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"started": started, "told": told, "pid": os.getpid()}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def do_POST(self):
        told.update(json.loads(self.rfile.read(int(self.headers["Content-Length"])))["env"])
        self.send_response(204); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", PORT), H).serve_forever()
""".replace("PORT", str(PORT))


@pytest.fixture(scope="module")
def warm_template(runtime: Runtime) -> str:
    tpl = runtime.templates.build_base(NAME)
    tpl.services = [{"name": "svc", "argv": ["/usr/bin/python3", "-c", SERVICE], "user": "user",
                     "port": PORT, "ready_path": "/ready", "env_path": "/env"}]  # fmt: skip
    tpl.warm = True
    meta = runtime.templates.root / NAME / "template.json"
    meta.write_text(json.dumps(tpl.to_json()))
    yield NAME
    runtime.warm.remove(NAME)
    runtime.templates.remove(NAME)


async def _service(info) -> dict:
    """The service's state (a booted sandbox starts it a moment after the create returns)."""
    get = f"curl -sf localhost:{PORT}/state"
    out = await sh(info, f"for i in $(seq 100); do {get} && exit; sleep 0.1; done")
    return json.loads(out.text)


async def test_creates_start_from_the_checkpoint_with_their_own_identity(
    warm_template, make_sandbox, runtime
):
    cold = await make_sandbox(template=warm_template)  # none yet: it boots
    assert cold.started_from is None
    runtime.warm.build(warm_template)
    a = await make_sandbox(template=warm_template, env={"WHO": "a"})
    b = await make_sandbox(template=warm_template, env={"WHO": "b"}, user="root")
    assert a.started_from == b.started_from == "warm"
    sa, sb = await _service(a), await _service(b)
    assert sa["started"] == sb["started"]  # the one service process of the checkpoint
    assert (sa["told"]["WHO"], sb["told"]["WHO"]) == ("a", "b")  # each told its own env
    assert (await sh(a, "echo $WHO; id -un")).text.split() == ["a", "user"]
    assert (await sh(b, "echo $WHO; id -un")).text.split() == ["b", "root"]
    assert len({runtime.get(i.id).host_uid for i in (cold, a, b)}) == 3  # own uid ranges
    await sh(a, "echo mine > /tmp/f")
    assert (await sh(b, "cat /tmp/f 2>/dev/null || echo none")).text.strip() == "none"
    runtime.kill(a.id)
    assert (await _service(b))["told"]["WHO"] == "b"  # untouched by its sibling's end


async def test_what_the_checkpoint_cannot_serve_boots_cold(warm_template, make_sandbox, runtime):
    d = runtime.warm.build(warm_template)
    need = int(json.loads((d / "warm.json").read_text())["memory_bytes"] * 1.5) >> 20
    small = await make_sandbox(template=warm_template, limits={"memory_mb": need - 1})
    disk = await make_sandbox(template=warm_template, limits={"disk_mb": 300})
    ws = await make_sandbox(template=warm_template, workspace_id="warm-ws")
    for info in (small, disk, ws):
        assert info.started_from is None
        assert (await _service(info))["told"] == {}  # booted: nothing to tell
    with pytest.raises(InvalidRequest, match="does not start warm"):
        runtime.warm.build("base")


async def test_a_damaged_checkpoint_boots_cold_and_leaves_nothing(
    warm_template, make_sandbox, runtime
):
    d = runtime.warm.build(warm_template)
    before = set(runtime.sandboxes_dir.iterdir())
    saved = d.with_name(".saved")
    shutil.copytree(d, saved)
    try:
        (d / process_tree.IMAGES / "core-1.img").write_bytes(b"not an image")
        info = await make_sandbox(template=warm_template, env={"WHO": "c"})
        assert info.started_from is None and (await sh(info, "echo $WHO")).text.strip() == "c"
        assert set(runtime.sandboxes_dir.iterdir()) == before | {info.dir}  # no half-made one
    finally:
        shutil.rmtree(d)
        saved.rename(d)
