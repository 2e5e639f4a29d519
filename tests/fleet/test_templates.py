"""Templates across the fleet (docs/fleet.md): a template built through the edge on one host
starts on another host that never built it, after its maker is gone, with its files as built
(whiteouts and opaque directories too); a delete through the edge reaches every host and the
store. The official SDK builds and starts it; a moto S3 server is the shared store."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import boto3
import httpx
import pytest
from e2b import Sandbox, Template, wait_for_port
from e2b.exceptions import SandboxException

from sandhold.service.fleet_templates import _rebase, _well_formed
from tests.fleet.harness import (
    BUCKET,
    TOKEN,
    Edge,
    catalog_url,
    new_host,
    running,
    s3_store,
    scrape,
    wait_for,
)
from tests.support.e2b_server import KEY_A, KEY_B, Server, needs_criu


@pytest.fixture
def fleet(postgres, tmp_path: Path) -> Iterator[tuple[list[Server], Edge, dict[str, str]]]:  # type: ignore[no-untyped-def]
    with s3_store() as store:
        hosts = [new_host(tmp_path, f"t{i}", **store) for i in (1, 2)]
        edge = Edge(tmp_path, catalog_url(postgres), hosts)
        with running(hosts, [edge]):
            yield hosts, edge, store


def listed(server: Server | Edge, key: str = KEY_A) -> set[str]:
    r = httpx.get(f"{server.url}/templates", headers={"X-API-KEY": key}, timeout=10)
    r.raise_for_status()
    return {t["templateID"] for t in r.json()}


def built_here(host: Server, tid: str) -> bool:
    """Whether the host has a build of ``tid`` with its files (its fleet info's, which
    placement reads; a stub is not there)."""
    r = httpx.get(f"{host.url}/fleet/info", headers={"X-Sandhold-Fleet-Token": TOKEN}, timeout=10)
    return any(name.startswith(f"{tid}.") for name in r.json()["local"])


def test_a_template_built_on_one_host_starts_on_another_after_its_maker_is_gone(fleet) -> None:  # type: ignore[no-untyped-def]
    hosts, edge, store = fleet
    tpl = (
        Template()
        .from_base_image()
        .run_cmd("mkdir -p /home/user/d && touch /home/user/d/old && echo built > /home/user/m")
        .run_cmd("rm -rf /home/user/d && mkdir /home/user/d && touch /home/user/d/new")
        .run_cmd("sudo rm /etc/hostname")
    )
    info = Template.build(tpl, "across", **edge.sdk())
    tid = info.template_id
    maker = next(h for h in hosts if built_here(h, tid))
    other = next(h for h in hosts if h is not maker)

    # The other host knows it (a stub: listed, its files not fetched), and so does the store.
    wait_for(lambda: tid in listed(other), 30, "the other host to learn the template")
    assert tid not in listed(other, KEY_B)  # still team A's alone
    s3 = boto3.client("s3", endpoint_url=store["snapshot_s3_endpoint_url"], region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    assert sum("fleet-template-data/meta/layer-" in k for k in keys) == 3
    assert not built_here(other, tid)

    # Its maker gone, a create through the edge starts it on the other host, as built.
    maker.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
    maker.proc.wait()  # type: ignore[union-attr]
    maker.sock.close()
    wait_for(lambda: tid in listed(edge), 30, "the edge to list it from the other host")
    sbx = Sandbox.create("across", timeout=120, **edge.sdk())
    try:
        run = sbx.commands.run(
            "cat /home/user/m; ls /home/user/d; test -e /etc/hostname || echo gone"
        )
        assert run.stdout.split() == ["built", "new", "gone"]
        assert (
            sbx.commands.run("stat -c %U /home/user/m").stdout.strip() == "user"
        )  # its owner kept
    finally:
        sbx.kill()
    assert built_here(other, tid)  # fetched, kept for the next create

    # Deleted through the edge: gone on the host and from the store.
    r = httpx.delete(f"{edge.url}/templates/{tid}", headers={"X-API-KEY": KEY_A}, timeout=30)
    assert r.status_code == 204, r.text
    with pytest.raises(SandboxException, match=r"not found|does not exist"):
        Sandbox.create("across", **edge.sdk())

    def out_of_store() -> bool:
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
        return not any("fleet-templates/meta/" in k for k in keys)

    wait_for(out_of_store, 30, "the template's record out of the store")
    maker.proc = None  # (the fixture's destroy cleans what the kill left)


def store_keys(store: dict[str, str]) -> list[str]:
    s3 = boto3.client("s3", endpoint_url=store["snapshot_s3_endpoint_url"], region_name="us-east-1")
    return [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]


def knows_warm(host: Server, tid: str) -> bool:
    """Whether the host's record of the template (a stub) names its maker's checkpoint."""
    for record in (host.data_dir / "templates").glob(f"{tid}.*/template.json"):
        return "warm" in (json.loads(record.read_text()).get("fleet") or {})
    return False


def warm_starts(host: Server) -> float:
    return scrape(host.url)[("sandhold_create_duration_seconds_count", (("start", "warm"),))]


def test_a_warm_template_starts_warm_on_a_host_that_never_ran_it(fleet) -> None:  # type: ignore[no-untyped-def]
    needs_criu()
    hosts, edge, store = fleet
    tpl = (
        Template()
        .from_base_image()
        .run_cmd("mkdir -p /home/user/site && echo served > /home/user/site/w")
        .set_workdir("/home/user/site")
        .set_start_cmd("python3 -m http.server 8000", wait_for_port(8000))
    )
    tid = Template.build(tpl, "warmed", **edge.sdk()).template_id
    maker = next(h for h in hosts if built_here(h, tid))
    other = next(h for h in hosts if h is not maker)
    Sandbox.create("warmed", **edge.sdk()).kill()  # cold, on its maker: which then makes the
    wait_for(  # checkpoint, and publishes it
        lambda: any("fleet-template-data/meta/warm-" in k for k in store_keys(store)),
        120,
        "the maker's checkpoint in the store",
    )
    wait_for(lambda: knows_warm(other, tid), 30, "the other host to learn of the checkpoint")

    maker.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
    maker.proc.wait()  # type: ignore[union-attr]
    maker.sock.close()
    wait_for(lambda: tid in listed(edge), 30, "the edge to list it from the other host")
    assert warm_starts(other) == 0
    sbx = Sandbox.create("warmed", timeout=120, **edge.sdk())
    try:
        assert sbx.commands.run("curl -sf localhost:8000/w").stdout.strip() == "served"
    finally:
        sbx.kill()
    assert warm_starts(other) == 1  # its first sandbox there: from the maker's checkpoint
    maker.proc = None


def test_a_fetched_tree_moves_to_this_hosts_owners(tmp_path: Path) -> None:
    old, new = 1_000_000, 2_000_000
    (tmp_path / "d").mkdir()
    (tmp_path / "d/f").write_text("x")
    os.symlink("/etc/passwd", tmp_path / "d/link")  # (its own owner changes, never its target's)
    os.lchown(tmp_path / "d", old, old)
    os.lchown(tmp_path / "d/f", old + 1000, old + 1000)
    os.lchown(tmp_path / "d/link", old + 5, old + 5)
    passwd = os.stat("/etc/passwd")
    _rebase(tmp_path / "d", old, new)
    assert os.lstat(tmp_path / "d").st_uid == new
    assert (os.lstat(tmp_path / "d/f").st_uid, os.lstat(tmp_path / "d/f").st_gid) == (
        new + 1000,
    ) * 2
    assert os.lstat(tmp_path / "d/link").st_uid == new + 5
    assert os.stat("/etc/passwd").st_uid == passwd.st_uid


def test_a_record_whose_names_would_make_paths_elsewhere_is_left_out() -> None:
    def record(name: str = "t1.b1", **place: object) -> dict[str, object]:
        return {
            "template": {"name": name},
            "place": {"uid_base": 100000, "layers": ["a1"], **place},
        }

    assert _well_formed("t1.b1", record(rootfs_of="base"))
    assert _well_formed("t1.b1", record(root="root-t1.b1-1", warm="0123abcd"))
    assert not _well_formed("../t1", record("../t1"))
    assert not _well_formed("t1.b1", record("t2.b2"))  # a record under another's name
    assert not _well_formed("t1.b1", record(rootfs_of="../../etc"))
    for bad in ("..", "../x", "/abs", ""):
        assert not _well_formed("t1.b1", {**record(), "place": {"uid_base": 1, "layers": [bad]}})
        assert not _well_formed("t1.b1", record(root=bad or "."))
    assert not _well_formed("t1.b1", {"template": {"name": "t1.b1"}})
