"""A credential the proxy injected, handed back by the upstream in every place and form a
reflecting server can give it (tests/egress/reflector.py), must never reach the sandbox: real
sandboxes, the host's egress daemon, the reflecting upstream in the test internet's namespace.
Each test checks that the upstream did receive the credential, then runs the oracle of
``leaks.py`` over every byte the sandbox got."""

from __future__ import annotations

import hashlib
import re

import pytest

from sandhold import audit
from tests.egress.fixtures import SECRET, daemon_pids
from tests.egress.internet import Internet
from tests.egress.leaks import fetch, leaked, split
from tests.egress.reflector import encodings
from tests.runtime.helpers import sh

AUTH_HASH = hashlib.sha256(f"Bearer {SECRET}".encode()).hexdigest()
URL = "https://api.example.test/reflect/"
STARS = b"*" * len(SECRET)


def received(internet: Internet, mark: int, mode: str) -> list[dict[str, object]]:
    got = [x for x in internet.since(mark) if str(x.get("path", "")).startswith(f"/reflect/{mode}")]
    assert got and all(x["auth_sha256"] == AUTH_HASH for x in got), got  # the upstream had it
    return got


def status(raw: bytes) -> bytes:
    return split(raw)[0].split(b"\r\n")[0]


@pytest.mark.parametrize(
    "mode",
    [
        "status",
        "header-name",
        "header-value",
        "informational",
        "trailer",
        "split",
        *(f"encoded-{name}" for name in encodings(b"x")),
    ],
)
async def test_a_reflected_credential_never_reaches_the_sandbox(egress_sandbox, internet, mode):
    sbx = await egress_sandbox(allow=["api.example.test"])
    mark = internet.mark()
    raw = await fetch(sbx, URL + mode)
    received(internet, mark, mode)
    assert status(raw).startswith(b"HTTP/1.1 200"), raw[:200]
    assert not leaked(raw, SECRET), raw
    if mode == "status":
        assert status(raw) == b"HTTP/1.1 200 Reflected Bearer " + STARS
    if mode in ("informational", "trailer"):
        assert b"X-Echo" not in raw and split(raw)[1] == b"ok"  # neither is forwarded


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "zstd", "gzip+br"])
async def test_compressed_bodies_are_decoded_scanned_and_forwarded_decoded(
    egress_sandbox, internet, coding
):
    sbx = await egress_sandbox(allow=["api.example.test"])
    mark = internet.mark()
    raw = await fetch(sbx, URL + f"compressed-{coding}")
    (rec,) = received(internet, mark, "compressed-")
    assert rec["accept_encoding"] == "identity"  # the sandbox asked for gzip, br, ...
    head, body = split(raw)
    assert b"content-encoding" not in head.lower()
    assert body == b"authorization: Bearer " + STARS + b"\n"
    assert not leaked(raw, SECRET)


async def test_the_proxy_asks_for_identity_and_an_honest_server_complies(egress_sandbox, internet):
    sbx = await egress_sandbox(allow=["api.example.test"])
    mark = internet.mark()
    raw = await fetch(sbx, URL + "negotiated")
    assert [r["accept_encoding"] for r in received(internet, mark, "negotiated")] == ["identity"]
    assert split(raw)[1] == b"authorization: Bearer " + STARS + b"\n"
    r = await sh(sbx, f"curl -s -i --compressed --max-time 10 {URL}compressed-gzip")
    assert r.exit_code == 0 and SECRET not in r.text and "Bearer " + "*" * len(SECRET) in r.text


async def test_a_credential_cannot_be_fetched_a_range_at_a_time(egress_sandbox, internet):
    sbx = await egress_sandbox(allow=["api.example.test"])
    mark = internet.mark()
    start = len("authorization: Bearer ")
    half = start + len(SECRET) // 2
    parts = [
        split(await fetch(sbx, URL + "range", f"Range: bytes={a}-{b}\r\n"))[1]
        for a, b in ((start, half - 1), (half, start + len(SECRET) - 1))
    ]
    assert [r["range"] for r in received(internet, mark, "range")] == [None, None]
    assert not leaked(b"".join(parts), SECRET) and not leaked(parts[0] + parts[1][-20:], SECRET)


@pytest.mark.parametrize("mode", ["malformed-status", "malformed-header", "unscannable"])
async def test_a_response_that_cannot_be_scanned_is_refused_without_quoting_it(
    egress_sandbox, internet, mode
):
    sbx = await egress_sandbox(allow=["api.example.test"])
    mark = internet.mark()
    raw = await fetch(sbx, URL + mode)
    received(internet, mark, mode)
    assert status(raw) == b"HTTP/1.1 502 Bad Gateway", raw
    assert not leaked(raw, SECRET), raw
    if mode == "unscannable":
        assert b"Content-Encoding 'compress'" in raw and b"cannot decode" in raw


@pytest.mark.parametrize("mode", ["malformed-chunk", "bad-gzip"])
async def test_a_body_that_breaks_half_way_is_cut_not_answered_into(
    egress_sandbox, internet, egress_settings, mode
):
    sbx = await egress_sandbox(allow=["api.example.test"])
    raw = await fetch(sbx, URL + mode)
    assert not leaked(raw, SECRET), raw
    assert raw.count(b"HTTP/1.1 ") == 1 and not raw.endswith(b"0\r\n\r\n")  # no end of body
    recs = audit.query(audit.egress_dir(egress_settings.data_dir), sandbox=sbx.id)
    reasons = [r["reason"] for r in recs if r["kind"] == "mitm"]
    assert reasons and reasons[0].startswith("response body cut"), reasons


async def test_a_host_that_hands_it_back_over_plain_http_is_scanned_too(egress_sandbox, internet):
    sbx = await egress_sandbox(allow=["api.example.test"])
    await fetch(sbx, URL + "remember")
    raw = await fetch(sbx, "http://api.example.test/reflect/recall")
    assert split(raw)[1] == b"Bearer " + STARS and not leaked(raw, SECRET)


async def test_curl_sees_blanks_in_the_status_line_and_header_names(egress_sandbox):
    sbx = await egress_sandbox(allow=["api.example.test"])
    r = await sh(
        sbx,
        f"curl -s -i --max-time 10 {URL}status; curl -s -i --max-time 10 {URL}header-name",
    )
    assert r.exit_code == 0 and SECRET not in r.text
    assert re.search(rf"HTTP/1.1 200 Reflected Bearer \*{{{len(SECRET)}}}", r.text)
    assert "x-r-" + "*" * len(SECRET) in r.text  # h11 writes names in lower case


async def test_a_decompression_bomb_is_streamed_in_bounded_memory(
    egress_sandbox, egress_settings, internet
):
    sbx = await egress_sandbox(allow=["api.example.test"])
    (pid,) = daemon_pids(egress_settings.data_dir)

    def peak_rss_kib() -> int:
        with open(f"/proc/{pid}/status") as f:
            return int(re.search(r"VmHWM:\s+(\d+)", f.read())[1])  # type: ignore[index]

    before = peak_rss_kib()
    mib = 128
    r = await sh(sbx, f"curl -s --max-time 120 '{URL}bomb?mib={mib}' | tail -c 80; echo")
    assert r.exit_code == 0
    assert r.text.strip().endswith("authorization: Bearer " + "*" * len(SECRET))
    r = await sh(sbx, f"curl -s --max-time 120 '{URL}bomb?mib={mib}' | wc -c")
    assert int(r.text) == (mib << 20) + len(f"authorization: Bearer {SECRET}\n")
    assert peak_rss_kib() - before < 48 * 1024  # it never held the 128 MiB
