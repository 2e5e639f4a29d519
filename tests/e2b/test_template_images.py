"""A template built from an image through the official SDK (``from_image`` with registry
credentials): pulled from a real registry on loopback holding an image this test builds and
pushes (a root with bash and cat, no Python), its env and workdir carried over, steps run in
it, sandboxes of it answering commands (the agent on the host's Python); bad credentials fail
the build by name."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox, Template
from e2b.exceptions import BuildException

from tests.runtime.test_oci import PASSWORD, USER, Registry, entry, push_image, running_registry
from tests.support.e2b_server import Server, new_server


def tiny_root() -> list:
    """bash and cat with the libraries they load, laid out as this host has them."""
    out = subprocess.run(["ldd", "/usr/bin/bash", "/usr/bin/cat"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    libs = sorted({w for w in out.split() if w.startswith("/") and not w.endswith(":")})
    entries, dirs = [], set()
    for path in ["/usr/bin/bash", "/usr/bin/cat", *libs]:
        real = os.path.realpath(path).lstrip("/")
        parts = Path(real).parent.parts
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in dirs:
                dirs.add(d)
                entries.append(entry(d + "/", "dir"))
        entries.append(entry(real, data=Path("/" + real).read_bytes(), mode=0o755))
        named = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
        if named.lstrip("/") != real:  # the soname, a link to the file
            entries.append(entry(named.lstrip("/"), "symlink", link=os.path.basename(real)))
    for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
        entries.append(entry(link, "symlink", link=target))
    if "usr/lib64" not in dirs:
        entries.append(entry("usr/lib64/", "dir"))
    loader = next(p for p in libs if "ld-linux" in p)
    entries.append(entry("usr/lib64/" + Path(loader).name, "symlink",
                         link=os.path.realpath(loader)))  # fmt: skip
    entries += [entry("etc/", "dir"), entry("srv/", "dir"), entry("tmp/", "dir", mode=0o1777),
                entry("etc/image-marker", data=b"from the image\n"),
                entry("etc/ld.so.cache", data=Path("/etc/ld.so.cache").read_bytes())]  # fmt: skip
    return entries


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, registry: Registry) -> Iterator[Server]:
    srv = new_server(tmp_path_factory.mktemp("images"), template_build_allow_out="[]",
                     template_image_ca_file=str(registry.ca),
                     template_image_registries=json.dumps([registry.host]))  # fmt: skip
    srv.start()
    yield srv
    srv.destroy()


def test_a_template_from_an_image(server: Server, registry: Registry, tmp_path: Path) -> None:
    config = {"Env": ["PATH=/usr/bin:/bin", "FROM_IMAGE=yes"], "WorkingDir": "/srv"}
    push_image(registry, tmp_path, "tiny/root:1", [tiny_root()], config)
    ref = f"{registry.host}/tiny/root:1"
    tpl = (
        Template()
        .from_image(ref, username=USER, password=PASSWORD)
        .run_cmd("echo built-here > /srv/built", user="root")
    )
    logs: list[str] = []
    Template.build(tpl, "from-image", on_build_logs=lambda e: logs.append(e.message),
                   **server.sdk())  # fmt: skip
    assert any(line.startswith(f"FROM {ref}") for line in logs), logs
    sbx = Sandbox.create("from-image", **server.sdk())
    try:
        r = sbx.commands.run("cat /etc/image-marker /srv/built; echo $FROM_IMAGE; echo $PWD",
                             user="root")  # fmt: skip
        assert r.stdout.split("\n")[:4] == ["from the image", "built-here", "yes", "/srv"]
        assert not sbx.files.exists("/usr/bin/python3")  # the image's root, not the host's
    finally:
        sbx.kill()
    refs = json.loads((server.data_dir / "templates" / ".images.json").read_text())
    assert list(refs) == [ref]  # imported once, by digest
    bad = Template().from_image(ref, username=USER, password="wrong")
    with pytest.raises(BuildException, match="unauthorized"):
        Template.build(bad, "from-image-bad", skip_cache=True, **server.sdk())


def test_the_sdks_image_shortcuts(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    """``from_debian_image``, ``from_ubuntu_image``, ``from_python_image``, ``from_node_image``
    name Docker Hub's official images without a registry: they go to the operator's
    ``template_image_registry`` (here a plain-HTTP one on loopback holding them). An image's
    numeric ``User`` is the user its passwd names (uid 1000: ``user``); steps run as it."""
    with running_registry(tmp_path_factory.mktemp("plain"), tls=False) as plain:
        shortcuts = {"debian:stable": lambda t: t.from_debian_image(),
                     "ubuntu:latest": lambda t: t.from_ubuntu_image(),
                     "python:3": lambda t: t.from_python_image(),
                     "node:lts": lambda t: t.from_node_image()}  # fmt: skip
        root, users = tiny_root(), ["", "1000:1000", "0", "root"]
        for i, ref in enumerate(shortcuts):
            marker = entry("etc/which-image", data=ref.encode())
            config = {"Env": [f"N={i}"], "User": users[i]}
            push_image(plain, tmp_path, f"library/{ref}", [root, [marker]], config)
        srv = new_server(tmp_path_factory.mktemp("shortcuts"), template_build_allow_out="[]",
                         template_image_registry=plain.host,
                         template_image_insecure=json.dumps([plain.host]))  # fmt: skip
        srv.start()
        try:
            for i, (ref, base) in enumerate(shortcuts.items()):
                tpl = base(Template()).run_cmd("echo $EUID > /home/user/who")
                Template.build(tpl, f"short-{i}", **srv.sdk())
                sbx = Sandbox.create(f"short-{i}", **srv.sdk())
                try:
                    r = sbx.commands.run("cat /etc/which-image; echo; echo $N; cat /home/user/who",
                                         user="root")  # fmt: skip
                    who = "1000" if i == 1 else "0"
                    assert r.stdout.split("\n")[:3] == [ref, str(i), who], r.stdout
                finally:
                    sbx.kill()
        finally:
            srv.destroy()
