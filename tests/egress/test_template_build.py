"""A template build's steps reach the build allow-list and nothing else
(runtime/templates/build.py):
``pip install`` of a package from an index on the test internet works; a step aiming at a host
off the list is refused by the egress proxy and that host sees nothing; a secret stored for a
host on the list is never injected into a build's requests nor seen by its steps."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import pytest

from sandhold.errors import TemplateBuildFailed
from sandhold.runtime.templates.build import Builder, BuildRequest, Step
from tests.egress.fixtures import SECRET
from tests.runtime.helpers import sh

WHEEL = "sandhold_probe-1.0-py3-none-any.whl"


def publish(files) -> None:
    """A one-module wheel and the simple index that lists it, served at /files/."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("sandhold_probe.py", 'VALUE = "probe"\n')
        info = "sandhold_probe-1.0.dist-info"
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: sandhold-probe\n"
                                       "Version: 1.0\n")  # fmt: skip
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: "
                                    "true\nTag: py3-none-any\n")  # fmt: skip
        z.writestr(f"{info}/RECORD", "")
    (files / WHEEL).write_bytes(buf.getvalue())
    index = files / "simple" / "sandhold-probe"
    index.mkdir(parents=True, exist_ok=True)
    (index / "index.html").write_text(f'<a href="/files/{WHEEL}">{WHEEL}</a>\n')


def test_a_build_reaches_its_allow_list_and_nothing_else(egress_runtime, internet, monkeypatch):
    rt = egress_runtime
    publish(internet.files)
    monkeypatch.setattr(rt.settings, "template_build_allow_out", ["api.example.test"])
    lines: list[str] = []
    builder = Builder(rt, {}.__getitem__)
    steps = [
        Step("ENV", ["PIP_INDEX_URL", "https://api.example.test/files/simple"]),
        Step("RUN", ["pip install --user sandhold-probe"]),
    ]  # (what pip_install sends)
    tpl = builder.build(BuildRequest("built-pip", "base", steps), lambda _l, m: lines.append(m))
    try:
        info = rt.create({"template": tpl.name})
        try:
            import asyncio

            r = asyncio.run(sh(info, "python3 -c 'import sandhold_probe as p; print(p.VALUE)'"))
            assert r.text.strip() == "probe", (r.text, lines)
        finally:
            rt.kill(info.id)
        mark = internet.mark()
        off_list = [Step("RUN", ["curl -sS --max-time 10 https://evil.test/ -o /dev/null"])]
        with pytest.raises(TemplateBuildFailed, match="exit code"):
            builder.build(BuildRequest("built-evil", "base", off_list), lambda _l, _m: None)
        assert not [r for r in internet.since(mark) if r.get("host") == "evil.test"]
        assert internet.trap_hits(mark) == 0
    finally:
        rt.templates.remove("built-pip")
        rt.layers.collect(rt.templates)


def test_a_build_step_gets_no_secret(egress_runtime, internet, secret_store, monkeypatch):
    """A secret stored for a host on the build allow-list is never injected into a build's
    requests to it (a build sandbox has no tenant), and no step sees it in its environment,
    files or output; the request itself reaches the host."""
    rt = egress_runtime
    monkeypatch.setattr(rt.settings, "template_build_allow_out", ["api.example.test"])
    lines: list[str] = []
    steps = [Step("RUN", ["curl -sS --max-time 10 https://api.example.test/auth > /home/user/got; "
                          "cat /home/user/got; echo; env"])]  # fmt: skip
    mark = internet.mark()
    tpl = Builder(rt, {}.__getitem__).build(BuildRequest("built-nosecret", "base", steps),
                                            lambda _l, m: lines.append(m))  # fmt: skip
    try:
        got = [r for r in internet.since(mark) if r.get("kind") == "https"]
        assert got and got[0]["host"] == "api.example.test" and got[0]["auth_sha256"] is None
        assert "auth-sha256=" + hashlib.sha256(b"").hexdigest() in lines, lines
        assert not any(SECRET in line for line in lines)
        layer = Path(tpl.layers[0])
        assert not any(SECRET.encode() in p.read_bytes() for p in layer.rglob("*") if p.is_file())
    finally:
        rt.templates.remove("built-nosecret")
        rt.layers.collect(rt.templates)
