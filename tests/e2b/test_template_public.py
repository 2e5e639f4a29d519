"""A team's template marked public, through the official SDK (its API client's ``PATCH
/v2/templates/{id}``, what E2B's ``template publish`` sends): another team cannot use it while
it is private (not found, as for anything it does not own), uses it by its template id once it
is public (create from it, build on it), and never rebuilds, deletes, tags, untags or reads the
builds of it; listings stay each team's own; unpublished, it is the owner's alone again."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from e2b import BuildInfo, ConnectionConfig, Sandbox, Template
from e2b.api.client.api.templates import patch_templates_template_id as patch_v1
from e2b.api.client.api.templates import patch_v_2_templates_template_id as patch_v2
from e2b.api.client.models import TemplateUpdateRequest
from e2b.api.client_sync import get_api_client
from e2b.exceptions import BuildException, SandboxException, TemplateException

from tests.support.e2b_server import KEY_A, KEY_B, Server, new_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = new_server(tmp_path_factory.mktemp("public"), template_build_allow_out="[]")
    srv.start()
    yield srv
    srv.destroy()


def publish(server: Server, key: str, ref: str, public: bool, v2: bool = True) -> int:
    """The SDK's API client's PATCH of a template's ``public``; its status code."""
    client = get_api_client(ConnectionConfig(api_key=key, api_url=server.url))
    module = patch_v2 if v2 else patch_v1
    r = module.sync_detailed(ref, client=client, body=TemplateUpdateRequest(public=public))
    return int(r.status_code)


def listed(server: Server, key: str) -> dict[str, bool]:
    with httpx.Client(base_url=server.url, headers={"X-API-KEY": key}) as api:
        return {t["templateID"]: t["public"] for t in api.get("/templates").json()}


def marker(server: Server, key: str, template: str) -> str:
    sbx = Sandbox.create(template, **server.sdk(key))
    try:
        return sbx.commands.run("cat /home/user/marker").stdout.strip()
    finally:
        sbx.kill()


def test_a_public_template_is_usable_by_other_teams_and_only_its_owners(server: Server) -> None:
    tpl = Template().from_base_image().run_cmd("echo from-a > /home/user/marker")
    info = Template.build(tpl, "shared:v1", **server.sdk(KEY_A))
    tid, a, b = info.template_id, server.sdk(KEY_A), server.sdk(KEY_B)

    # Private: team B cannot use it, by its id or its store name, nor see that the id exists.
    for ref in (tid, f"{tid}:v1"):
        with pytest.raises(SandboxException, match=r"not found|does not exist"):
            Sandbox.create(ref, **b)
    assert not Template.exists(tid, **b)
    with pytest.raises(BuildException, match="unknown base template"):
        Template.build(Template().from_template(tid), "on-top", **b)
    assert publish(server, KEY_B, tid, True) == 404  # not B's to publish
    assert listed(server, KEY_A)[tid] is False

    # Public: B creates from it and builds on it, by its id (its names are A's own).
    assert publish(server, KEY_A, "shared", True) == 200  # (by name or by id)
    assert listed(server, KEY_A)[tid] is True
    assert marker(server, KEY_B, f"{tid}:v1") == "from-a"
    assert Template.exists(tid, **b)
    with pytest.raises(SandboxException, match=r"not found|does not exist"):
        Sandbox.create("shared:v1", **b)  # B's own name space: it has no `shared`
    on_top = Template().from_template(f"{tid}:v1").run_cmd("echo on-b >> /home/user/marker")
    Template.build(on_top, "mine", **b)
    assert marker(server, KEY_B, "mine") == "from-a\non-b"

    # Only A rebuilds it, tags, untags, deletes it and reads its builds; B's listing has none
    # of A's templates (E2B lists a team's own).
    assert tid not in listed(server, KEY_B)
    with pytest.raises(TemplateException, match=r"404: template .* not found"):
        Template.assign_tags(f"{tid}:v1", ["stolen"], **b)
    with pytest.raises(TemplateException, match=r"404: template .* not found"):
        Template.remove_tags(tid, ["v1"], **b)
    with pytest.raises(TemplateException, match=r"404: template .* not found"):
        Template.get_tags(tid, **b)
    with pytest.raises(BuildException, match=r"404: build .* not found"):
        theirs = BuildInfo(template_id=tid, build_id=info.build_id, name="shared", alias="shared")
        Template.get_build_status(theirs, **b)
    with httpx.Client(base_url=server.url, headers={"X-API-KEY": KEY_B}) as api:
        assert api.delete(f"/templates/{tid}").status_code == 404
    with pytest.raises(BuildException, match="form of a template id"):
        Template.build(Template().from_base_image(), f"{tid}:v1", **b)  # not a rebuild of A's
    assert {t.tag for t in Template.get_tags("shared", **a)} == {"v1"}
    assert marker(server, KEY_B, f"{tid}:v1") == "from-a"

    # A's rebuild keeps it public; unpublished (v1 of the endpoint), it is A's alone again.
    tpl2 = Template().from_base_image().run_cmd("echo from-a-2 > /home/user/marker")
    Template.build(tpl2, "shared:v1", **a)
    assert listed(server, KEY_A)[tid] is True
    assert marker(server, KEY_B, f"{tid}:v1") == "from-a-2"
    assert publish(server, KEY_A, tid, False, v2=False) == 200
    with pytest.raises(SandboxException, match=r"not found|does not exist"):
        Sandbox.create(f"{tid}:v1", **b)
    assert marker(server, KEY_A, "shared:v1") == "from-a-2"
    assert marker(server, KEY_B, "mine") == "from-a\non-b"  # what B built on it stays B's


def test_bad_updates_are_refused_and_change_nothing(server: Server) -> None:
    info = Template.build(Template().from_base_image().run_cmd("true"), "upd", **server.sdk(KEY_A))
    with httpx.Client(base_url=server.url, headers={"X-API-KEY": KEY_A}) as api:
        for body, word in (({"public": "yes"}, "public"), ({"private": True}, "private")):
            r = api.patch(f"/v2/templates/{info.template_id}", json=body)
            assert r.status_code == 400 and word in r.json()["message"], r.text
        assert api.patch("/v2/templates/base", json={"public": False}).status_code == 404
        assert api.patch("/v2/templates/nope", json={"public": True}).status_code == 404
        r = api.patch(f"/v2/templates/{info.template_id}", json={})
        assert r.status_code == 200 and r.json() == {"names": ["upd"]}
    assert listed(server, KEY_A)[info.template_id] is False


def test_another_team_cannot_plant_or_probe_a_builds_files(server: Server) -> None:
    """A's build waiting for its files: B gets no upload link for it (not found), cannot
    upload with A's build id and a token of its own, and nothing lands among A's uploads."""
    digest = "cd" * 32
    with (httpx.Client(base_url=server.url, headers={"X-API-KEY": KEY_A}) as a,
          httpx.Client(base_url=server.url, headers={"X-API-KEY": KEY_B}) as b):  # fmt: skip
        mine = a.post("/v3/templates", json={"name": "files-a"}).json()
        theirs = b.post("/v3/templates", json={"name": "files-b"}).json()
        tid, build = mine["templateID"], mine["buildID"]
        assert a.get(f"/templates/{tid}/files/{digest}").status_code == 201  # A's own: a link
        assert b.get(f"/templates/{tid}/files/{digest}").status_code == 404
        link = b.get(f"/templates/{theirs['templateID']}/files/{digest}").json()["url"]
        token = link.split("token=")[1]
        for query in (f"build={build}&token={token}", f"build={build}&token=",
                      f"build={theirs['buildID']}&token={token}"):  # fmt: skip
            r = httpx.put(f"{server.url}/templates/{tid}/files/{digest}?{query}",
                          content=b"planted")  # fmt: skip
            assert r.status_code == 403, (query, r.text)
        assert a.get(f"/templates/{tid}/files/{digest}").json()["present"] is False
        assert b.get(f"/templates/{tid}/builds/{build}/status").status_code == 404
