"""The official SDK's ``Template`` builder against ``sandhold serve``: a template built from
steps (files uploaded by hash, commands, env, workdir, a start command with its ready command),
its build log streamed, sandboxes made of it with the start command serving, a cached rebuild,
a failing step, tags, another team kept out, deletion; a template read with its builds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import ConnectionConfig, Sandbox, Template, wait_for_port
from e2b.api.client.api.templates import get_default_templates, get_templates_template_id
from e2b.api.client_sync import get_api_client
from e2b.exceptions import BuildException, SandboxException, TemplateException

from tests.support.e2b_server import KEY_A, KEY_B, Server, new_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # Builds without egress here: no step of these reaches a registry (the tests send nothing
    # off this machine).
    srv = new_server(tmp_path_factory.mktemp("templates"), template_build_allow_out="[]")
    srv.start()
    yield srv
    srv.destroy()


def app_template(context: Path, marker: str = "built") -> Template:
    (context / "app.txt").write_text("from the context\n")
    return (
        Template(file_context_path=str(context))
        .from_base_image()
        .set_envs({"GREETING": "hello"})
        .copy("app.txt", "/home/user/app.txt")
        .run_cmd(f"echo {marker} > /home/user/built.txt")
        .make_dir("/home/user/data")
        .set_workdir("/home/user")
        .set_start_cmd("python3 -m http.server 8000", wait_for_port(8000))
    )


def test_build_run_rebuild_tag_and_delete(server: Server, tmp_path: Path) -> None:
    assert Template.exists("base", **server.sdk())
    assert not Template.exists("my-app", **server.sdk())
    logs: list[str] = []
    info = Template.build(app_template(tmp_path), "my-app:v1", on_build_logs=lambda e:
                          logs.append(e.message), cpu_count=1, memory_mb=768,
                          **server.sdk())  # fmt: skip
    assert info.tags == ["v1"] and any("COPY app.txt" in line for line in logs), logs
    sbx = Sandbox.create("my-app:v1", **server.sdk())
    try:
        details = sbx.get_info()
        assert (details.cpu_count, details.memory_mb) == (1, 768)  # the template's defaults
        # Handed out with its start command serving: no wait.
        r = sbx.commands.run("pwd; echo $GREETING; cat app.txt built.txt; test -d data && "
                             "echo dir; curl -sf localhost:8000/app.txt")  # fmt: skip
        assert r.stdout.split("\n")[:6] == ["/home/user", "hello", "from the context", "built",
                                            "dir", "from the context"], r.stdout  # fmt: skip
    finally:
        sbx.kill()
    with pytest.raises(SandboxException, match=r"does not exist|not found"):
        Sandbox.create("my-app", **server.sdk())  # its default tag was never built
    # An identical rebuild comes from the cache.
    again: list[str] = []
    Template.build(app_template(tmp_path), "my-app:v1", on_build_logs=lambda e:
                   again.append(e.message), **server.sdk())  # fmt: skip
    assert sum(line.startswith("CACHED") for line in again) >= 3, again
    assert any("Skipping upload of 'app.txt', already cached" in line for line in again)
    # Tags.
    Template.assign_tags("my-app:v1", ["prod"], **server.sdk())
    assert {t.tag for t in Template.get_tags("my-app", **server.sdk())} == {"v1", "prod"}
    Sandbox.create("my-app:prod", **server.sdk()).kill()
    Template.remove_tags("my-app", ["prod"], **server.sdk())
    with pytest.raises(SandboxException, match=r"does not exist|not found"):
        Sandbox.create("my-app:prod", **server.sdk())
    # Listed for its team only (the built-ins for every team).
    for key, want in ((KEY_A, {"base", "my-app"}), (KEY_B, {"base"})):
        with httpx.Client(base_url=server.url, headers={"X-API-KEY": key}) as api:
            listed = api.get("/templates").json()
        assert want <= {t["names"][0] for t in listed} and (
            key == KEY_A or "my-app" not in {t["names"][0] for t in listed}
        )
    # Another team: it exists (E2B's 403), but it is not theirs to use.
    assert Template.exists("my-app", **server.sdk(KEY_B))
    with pytest.raises(SandboxException, match=r"does not exist|not found"):
        Sandbox.create("my-app:v1", **server.sdk(KEY_B))
    # Deletion: its names at once; its builds and the layers only they use once no sandbox
    # runs on them (a running one keeps its files meanwhile).
    layers = server.data_dir / "templates" / ".layers"
    assert any(d for d in layers.iterdir() if not d.name.startswith("."))
    running = Sandbox.create("my-app:v1", **server.sdk())
    with httpx.Client(base_url=server.url, headers={"X-API-KEY": KEY_A}) as api:
        assert api.get(f"/templates/{info.template_id}").json()["names"] == ["my-app"]
        assert api.delete(f"/templates/{info.template_id}").status_code == 204
        assert api.get(f"/templates/{info.template_id}").status_code == 404
    assert not Template.exists("my-app", **server.sdk())
    with pytest.raises(SandboxException, match=r"does not exist|not found"):
        Sandbox.create("my-app:v1", **server.sdk())
    assert running.commands.run("cat /home/user/app.txt").stdout == "from the context\n"
    assert any(d for d in layers.iterdir() if not d.name.startswith("."))
    running.kill()
    deadline = time.monotonic() + 60  # (the warmer may be checkpointing one of it meanwhile)
    while server.runtime().list() and time.monotonic() < deadline:
        time.sleep(0.2)
    Template.build(Template().from_base_image().run_cmd("true"), "other", **server.sdk())
    left = [d.name for d in layers.iterdir() if not d.name.startswith(".")]
    names = [t.name for t in server.runtime().templates.list()]
    assert len(left) == 1, (left, names)  # only the new template's


def test_a_failing_step_fails_the_build_and_leaves_no_template(server: Server) -> None:
    tpl = Template().from_base_image().run_cmd("echo about to fail; exit 7")
    logs: list[str] = []
    with pytest.raises(BuildException, match="exit code 7"):
        Template.build(tpl, "broken", on_build_logs=lambda e: logs.append(e.message),
                       **server.sdk())  # fmt: skip
    assert "about to fail" in logs
    assert not Template.exists("broken", **server.sdk())


async def test_the_async_builder(server: Server, tmp_path: Path) -> None:
    from e2b import AsyncSandbox, AsyncTemplate

    (tmp_path / "data.txt").write_text("async\n")
    tpl = (AsyncTemplate(file_context_path=str(tmp_path)).from_template("base")
           .copy("data.txt", "/home/user/data.txt", mode=0o600))  # fmt: skip
    await AsyncTemplate.build(tpl, "async-app", **server.sdk())
    sbx = await AsyncSandbox.create("async-app", **server.sdk())
    try:
        r = await sbx.commands.run("cat data.txt; stat -c %a data.txt; stat -c %U data.txt")
        assert r.stdout.split() == ["async", "600", "user"], r.stderr  # the current user's
    finally:
        await sbx.kill()


def test_bad_input_is_refused_by_name(server: Server) -> None:
    with pytest.raises(BuildException, match="invalid tag 'bad tag'"):
        Template.build(Template().from_base_image(), "app:bad tag", **server.sdk())
    with pytest.raises(BuildException, match="invalid template name"):
        Template.build(Template().from_base_image(), "Bad Name!", **server.sdk())
    with pytest.raises(BuildException, match="image reference 'Bad Ref!' does not parse"):
        Template.build(Template().from_image("Bad Ref!"), "from-bad-ref", **server.sdk())
    with pytest.raises(BuildException, match="unknown base template 'nope'"):
        Template.build(Template().from_template("nope"), "from-nope", **server.sdk())
    with pytest.raises(TemplateException, match="escapes the context directory"):
        Template().from_base_image().copy("../outside.txt", "/x")  # (the SDK's own check)
    # What another client may send: refused by name, and no build is left started.
    with httpx.Client(base_url=server.url, headers={"X-API-KEY": KEY_A}) as api:
        made = api.post("/v3/templates", json={"name": "raw"}).json()
        start = f"/v2/templates/{made['templateID']}/builds/{made['buildID']}"
        for steps, message in (
            ([{"type": "ADD", "args": ["a", "/b"]}], "step 1: unsupported instruction 'ADD'"),
            ([{"type": "COPY", "args": ["../x", "/y"], "filesHash": "ab" * 32}],
             "step 1 (COPY): the source '../x' is outside the build context"),
            ([{"type": "RUN", "args": ["true"]}, {"type": "COPY", "args": ["/etc", "/y"],
              "filesHash": "ab" * 32}], "step 2 (COPY): the source '/etc' is outside"),
        ):  # fmt: skip
            r = api.post(start, json={"fromImage": "e2bdev/base", "steps": steps})
            assert r.status_code == 400 and message in r.json()["message"], r.text
        r = api.get(f"/templates/{made['templateID']}/builds/{made['buildID']}/status")
        assert r.json()["status"] == "waiting"
    assert not Template.exists("raw", **server.sdk())


def test_a_template_with_its_builds_a_page_at_a_time(server: Server) -> None:
    # (last in this module: the deletion test above counts the layers left)
    first = Template.build(Template().from_base_image().run_cmd("echo one"), "paged:v1",
                           cpu_count=1, **server.sdk())  # fmt: skip
    second = Template.build(Template().from_base_image().run_cmd("echo two"), "paged:v2",
                            **server.sdk())  # fmt: skip
    tid = first.template_id
    assert second.template_id == tid
    client = get_api_client(ConnectionConfig(api_key=KEY_A, api_url=server.url))
    whole = get_templates_template_id.sync_detailed(tid, client=client)
    assert whole.status_code == 200, whole.content
    t = whole.parsed
    assert t.template_id == tid and t.names == ["paged"] and not t.public
    assert [str(b.build_id) for b in t.builds] == [second.build_id, first.build_id]  # newest 1st
    assert [b.status.value for b in t.builds] == ["ready", "ready"]
    assert [b.cpu_count for b in t.builds][1] == 1 and t.created_at <= t.updated_at
    one = get_templates_template_id.sync_detailed(tid, client=client, limit=1)
    assert [str(b.build_id) for b in one.parsed.builds] == [second.build_id]
    token = one.headers["x-next-token"]
    rest = get_templates_template_id.sync_detailed(tid, client=client, limit=1, next_token=token)
    assert [str(b.build_id) for b in rest.parsed.builds] == [first.build_id]
    assert "x-next-token" not in rest.headers
    with httpx.Client(base_url=server.url, headers={"X-API-KEY": KEY_A}) as api:
        # A build requested and not started yet is one of them, waiting.
        made = api.post("/v3/templates", json={"name": "paged", "tags": ["v3"]}).json()
        newest = api.get(f"/templates/{tid}").json()["builds"][0]
        assert (newest["buildID"], newest["status"]) == (made["buildID"], "waiting")
        for bad in ("limit=0", "limit=101", "limit=x", "nextToken=nope"):
            r = api.get(f"/templates/{tid}?{bad}")
            assert r.status_code == 400 and r.json()["code"] == 400, (bad, r.text)
        assert api.get("/templates/not-a-template").status_code == 404
    # Another team's template is not found, for that team; the built-ins are everyone's.
    theirs = get_api_client(ConnectionConfig(api_key=KEY_B, api_url=server.url))
    assert get_templates_template_id.sync_detailed(tid, client=theirs).status_code == 404
    base = get_templates_template_id.sync_detailed("base", client=theirs).parsed
    assert base.names == ["base"] and [b.status.value for b in base.builds] == ["ready"]
    defaults = get_default_templates.sync(client=client)
    assert defaults is not None
    names = {n for d in defaults for n in d.names}
    assert "base" in names and "paged" not in names
