"""Cross-team layer-cache poisoning through a template COPY (issue 27, breach 3), and bounded COPY
archives, against a real `sandhold serve` with two teams driven by the official SDK.

Team A learns the files hash team B's SDK will send for a COPY and uploads an archive of its own
under it (the SDK's own calls: the upload link, a PUT of a tar), then builds; B's unmodified
build must not reuse that layer, and B's sandbox must hold B's files. An archive whose files do
not hash to its name is refused at the start with the step named, and removed; one that hashes
to B's (the SDK's hash frames nothing: a path can take in the modes and names of the entries
before it) is accepted, yet shares no layer with B's, whose bytes differ. A gzip bomb is
refused from its header. Identical bytes from two teams still share the layer; and the SDK's
archives of every kind (directories, symlinks, resolved or not, hard links, ignore patterns,
mode and user) pass the check."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import ConnectionConfig, Sandbox, Template
from e2b.api.client_sync import get_api_client
from e2b.exceptions import BuildException
from e2b.template.utils import calculate_files_hash, tar_file_stream
from e2b.template_sync.build_api import (
    get_file_upload_link,
    request_build,
    trigger_build,
    upload_file,
    wait_for_build_finish,
)

from tests.support.e2b_server import KEY_A, KEY_B, Server, new_server

DISK_MB = 256  # the build's disk budget here: the bomb's 1 GiB is 4 times it


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = new_server(tmp_path_factory.mktemp("cache-attacks"), template_build_allow_out="[]",
                     template_build_disk_mb=str(DISK_MB))  # fmt: skip
    srv.start()
    yield srv
    srv.destroy()


def client(server: Server, key: str) -> Any:
    return get_api_client(ConnectionConfig(api_key=key, api_url=server.url))


def body(tpl: Template) -> Any:
    """What the SDK's ``Template.build`` sends to start ``tpl`` (its steps with their hashes)."""
    return tpl._template._serialize(tpl._template._instructions_with_hashes())


def upload_link(server: Server, key: str, name: str, files_hash: str) -> tuple[Any, str]:
    """A build of ``name`` requested and the link to upload ``files_hash`` to, as the SDK gets
    them (``POST /v3/templates``, ``GET /templates/{id}/files/{hash}``)."""
    api = client(server, key)
    build = request_build(api, name=name, tags=None, cpu_count=None, memory_mb=None,
                          min_free_disk_mb=None)  # fmt: skip
    link = get_file_upload_link(api, build.template_id, files_hash)
    assert link.present is False and link.url
    return build, str(link.url)


def put(url: str, data: bytes) -> None:
    """The SDK's upload: a PUT of the archive to the link."""
    r = httpx.put(url, content=data, headers={"Content-Length": str(len(data))}, timeout=60)
    r.raise_for_status()


def start(server: Server, key: str, build: Any, tpl_body: Any) -> list[str]:
    """Start ``build`` with ``tpl_body`` and wait for it (the SDK's calls); its log."""
    api, logs = client(server, key), []
    trigger_build(api, build.template_id, build.build_id, tpl_body)
    wait_for_build_finish(api, build.template_id, build.build_id,
                          on_build_logs=lambda e: logs.append(e.message))  # fmt: skip
    return logs


def build(server: Server, key: str, tpl: Template, name: str) -> list[str]:
    logs: list[str] = []
    Template.build(tpl, name, on_build_logs=lambda e: logs.append(e.message), **server.sdk(key))
    return logs


def run(server: Server, key: str, template: str, cmd: str) -> str:
    sbx = Sandbox.create(template, **server.sdk(key))
    try:
        return sbx.commands.run(cmd).stdout
    finally:
        sbx.kill()


def cached_copies(logs: list[str]) -> list[str]:
    return [line for line in logs if line.startswith("CACHED") and " COPY " in line]


def uploads(server: Server) -> set[str]:
    return {p.name for p in (server.data_dir / "template-uploads").glob("*/*")}


def layers(server: Server) -> set[str]:
    return {p.name for p in (server.data_dir / "templates" / ".layers").glob("*")}


def test_another_teams_archive_under_my_hash_is_refused_and_never_reaches_me(
    server: Server, tmp_path: Path
) -> None:
    ctx_b, ctx_a = tmp_path / "b", tmp_path / "a"
    for ctx, who in ((ctx_b, "b"), (ctx_a, "a")):
        ctx.mkdir()
        (ctx / "app.txt").write_text(f"from-{who}\n")
    tpl_b = (Template(file_context_path=str(ctx_b)).from_base_image()
             .copy("app.txt", "/home/user/app.txt"))  # fmt: skip
    b_hash = calculate_files_hash("app.txt", "/home/user/app.txt", str(ctx_b), [], False, None)

    # A: its own app.txt uploaded under B's hash (the SDK's upload of A's context), B's steps.
    evil, url = upload_link(server, KEY_A, "evil", b_hash)
    upload_file(client(server, KEY_A), "app.txt", str(ctx_a), url, [], False, True, None)
    refused = None
    try:
        start(server, KEY_A, evil, body(tpl_b))
    except BuildException as e:
        refused = str(e)

    logs = build(server, KEY_B, tpl_b, "victim")
    assert not cached_copies(logs), logs
    assert run(server, KEY_B, "victim", "cat /home/user/app.txt") == "from-b\n"
    # ... and A was told why, naming the step, its upload gone (A may upload the right one).
    assert refused is not None and "step 1 (COPY app.txt /home/user/app.txt)" in refused
    assert "hash to" in refused and "the upload was removed" in refused, refused
    assert get_file_upload_link(client(server, KEY_A), evil.template_id, b_hash).present is False


def collision(ctx: Path, name: str, content: bytes) -> bytes:
    """An archive of one file whose SDK files hash for ``COPY . <dest>`` is that of ``ctx``
    holding ``x/<name>`` with ``content``: the SDK hashes ``.``, its mode, ``x``, its mode, then
    ``x/<name>``, with nothing between them, so a single path made of those says the same."""
    modes = [os.stat(ctx).st_mode, os.stat(ctx / "x").st_mode]
    info = tarfile.TarInfo(f".{modes[0]}x{modes[1]}x/{name}")
    info.size, info.mode = len(content), os.stat(ctx / "x" / name).st_mode & 0o7777
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        tar.addfile(info, io.BytesIO(content))
    return out.getvalue()


def test_an_archive_that_hashes_like_mine_still_shares_no_layer_with_mine(
    server: Server, tmp_path: Path
) -> None:
    ctx = tmp_path / "b"
    (ctx / "x").mkdir(parents=True)
    (ctx / "x" / "f").write_bytes(b"AB")
    tpl_b = Template(file_context_path=str(ctx)).from_base_image().copy(".", "/opt/app/")
    b_hash = calculate_files_hash(".", "/opt/app/", str(ctx), [], False, None)

    # A's archive passes the hash check (it does hash to B's), and builds: another layout.
    evil, url = upload_link(server, KEY_A, "evil-collision", b_hash)
    put(url, collision(ctx, "f", b"AB"))
    a_logs = start(server, KEY_A, evil, body(tpl_b))
    assert not cached_copies(a_logs), a_logs

    logs = build(server, KEY_B, tpl_b, "victim-collision")
    assert not cached_copies(logs), logs
    assert run(server, KEY_B, "victim-collision", "ls -A /opt/app; cat /opt/app/x/f") == "x\nAB"


def test_a_mismatching_claim_is_refused_and_leaves_nothing(server: Server, tmp_path: Path) -> None:
    (tmp_path / "conf.txt").write_text("real\n")
    tpl = Template(file_context_path=str(tmp_path)).from_base_image().copy("conf.txt", "/etc/c")
    claimed = calculate_files_hash("conf.txt", "/etc/c", str(tmp_path), [], False, None)
    job, url = upload_link(server, KEY_A, "liar", claimed)
    sent = body(tpl)  # (its hash, then the file changed before it was archived)
    (tmp_path / "conf.txt").write_text("changed after hashing\n")
    upload_file(client(server, KEY_A), "conf.txt", str(tmp_path), url, [], False, True, None)
    before_layers, before_uploads = layers(server), uploads(server)
    assert claimed in before_uploads
    with pytest.raises(BuildException, match=r"step 1 \(COPY conf.txt /etc/c\).*hash to"):
        trigger_build(client(server, KEY_A), job.template_id, job.build_id, sent)
    assert uploads(server) == before_uploads - {claimed}
    assert layers(server) <= before_layers  # (no layer made; collected ones may go)
    assert not Template.exists("liar", **server.sdk(KEY_A))
    assert not [i for i in server.runtime().list() if "template_build" in i.extra]


def bomb(size: int) -> bytes:
    """A tar.gz of one file of ``size`` zero bytes, in about size/1000 bytes: gzip members
    (each a MiB of zeros) concatenated, as gzip allows."""
    mib = gzip.compress(b"\0" * (1 << 20))
    info = tarfile.TarInfo("zeros")
    info.size = size
    end = gzip.compress(b"\0" * 2 * tarfile.BLOCKSIZE)
    return gzip.compress(info.tobuf()) + mib * (size >> 20) + end


def test_a_gzip_bomb_is_refused_from_its_header(server: Server, tmp_path: Path) -> None:
    (tmp_path / "zeros").write_text("small\n")
    tpl = Template(file_context_path=str(tmp_path)).from_base_image().copy("zeros", "/opt/z")
    claimed = calculate_files_hash("zeros", "/opt/z", str(tmp_path), [], False, None)
    job, url = upload_link(server, KEY_A, "bomb", claimed)
    data = bomb(1 << 30)
    assert len(data) < 2 << 20  # (fits template_upload_max_mb)
    put(url, data)
    with pytest.raises(BuildException, match=rf"unpacks to more than {DISK_MB} MiB"):
        trigger_build(client(server, KEY_A), job.template_id, job.build_id, body(tpl))
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    assert claimed not in uploads(server)
    # The same template, its real file uploaded by the SDK, builds.
    build(server, KEY_A, tpl, "bomb")
    assert run(server, KEY_A, "bomb", "cat /opt/z") == "small\n"


def test_identical_bytes_from_two_teams_share_the_layer(server: Server, tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "shared.txt").write_text("the same for both\n")
    tpl = Template(file_context_path=str(tmp_path)).from_base_image().copy("lib", "/opt/lib/")
    files_hash = calculate_files_hash("lib", "/opt/lib/", str(tmp_path), [], False, None)
    with tar_file_stream("lib", str(tmp_path), [], False, True) as archive:
        data = archive.read()
    for key in (KEY_A, KEY_B):  # the same bytes uploaded by each (the SDK then skips its own)
        put(upload_link(server, key, "shared-lib", files_hash)[1], data)
    assert not cached_copies(build(server, KEY_A, tpl, "shared-lib"))
    assert cached_copies(build(server, KEY_B, tpl, "shared-lib"))
    assert run(server, KEY_B, "shared-lib", "cat /opt/lib/shared.txt") == "the same for both\n"


def test_the_sdks_archives_of_every_kind_pass_the_check(server: Server, tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    (ctx / "d" / "sub").mkdir(parents=True)
    (ctx / "d" / "sub" / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (ctx / "d" / "sub" / "run.sh").chmod(0o750)
    (ctx / "d" / "big.bin").write_bytes(os.urandom(3 << 20))
    os.link(ctx / "d" / "big.bin", ctx / "d" / "hard.bin")  # (a hard link in the archive)
    (ctx / "d" / "link").symlink_to("sub/run.sh")
    (ctx / "d" / "-dash.txt").write_text("dash\n")
    (ctx / "d" / "skip.log").write_text("ignored\n")
    (ctx / ".dockerignore").write_text("**/*.tmp\n")
    (ctx / "d" / "scratch.tmp").write_text("ignored too\n")
    (ctx / "top.txt").write_text("top\n")
    tpl = (
        Template(file_context_path=str(ctx), file_ignore_patterns=["*.log", "d/*.log"])
        .from_base_image()
        .copy("d", "/opt/d/")  # a directory: symlink kept, hard link, ignore patterns
        .copy("d/link", "/opt/resolved", resolve_symlinks=True)  # its target's file
        .copy("d", "/opt/r/", resolve_symlinks=True)
        .copy(["top.txt", "d/-dash.txt"], "/opt/many/", user="user", mode=0o600)
        .copy("d/*.bin", "/opt/bins/")
    )
    build(server, KEY_A, tpl, "kinds")
    out = run(server, KEY_A, "kinds", (
        "cd /opt; readlink d/link; sh d/link; cat resolved; test -L r/link || echo r-file; "
        "LC_ALL=C ls d bins; stat -c '%U %a' many/top.txt many/-dash.txt; "
        "cmp d/big.bin d/hard.bin && echo same"))  # fmt: skip
    assert out.split("\n") == [
        "sub/run.sh", "ran", "#!/bin/sh", "echo ran", "r-file",
        "bins:", "big.bin", "hard.bin", "", "d:", "-dash.txt", "big.bin", "hard.bin", "link",
        "sub", "user 600", "user 600", "same", "",
    ], out  # fmt: skip


def js_files_hash(src: str, dest: str, ctx: Path) -> str:
    """The JS SDK's files hash (e2b@2.51.0): the Python SDK's, but with each directory's size on
    the client's disk hashed too, which no archive carries."""
    import hashlib
    import stat as st

    from e2b.template.utils import get_all_files_in_path

    h = hashlib.sha256(f"COPY {src} {dest}".encode())
    for path in get_all_files_in_path(src, str(ctx), [], True):
        info = os.lstat(path)
        h.update(os.path.relpath(path, ctx).encode())
        h.update(str(info.st_mode).encode())
        h.update(str(info.st_size).encode())
        if st.S_ISREG(info.st_mode):
            h.update(Path(path).read_bytes())
    return h.hexdigest()


def test_a_js_sdk_directory_copy_is_taken_on_the_servers_digest(
    server: Server, tmp_path: Path
) -> None:
    """The JS SDK's claim for a directory cannot be recomputed from the archive: the copy is
    accepted, keyed (as every copy) on the archive's own digest."""
    (tmp_path / "site" / "css").mkdir(parents=True)
    (tmp_path / "site" / "css" / "a.css").write_text("body{}\n")
    tpl = Template(file_context_path=str(tmp_path)).from_base_image().copy("site", "/opt/site/")
    claimed = js_files_hash("site", "/opt/site/", tmp_path)
    assert claimed != calculate_files_hash("site", "/opt/site/", str(tmp_path), [], False, None)
    job, url = upload_link(server, KEY_A, "js-dir", claimed)
    with tar_file_stream("site", str(tmp_path), [], False, True) as archive:
        put(url, archive.read())
    sent = body(tpl)
    sent["steps"][-1]["filesHash"] = claimed
    start(server, KEY_A, job, sent)
    assert run(server, KEY_A, "js-dir", "cat /opt/site/css/a.css") == "body{}\n"
