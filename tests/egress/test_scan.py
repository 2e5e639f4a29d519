"""The response scanner and the content decoders on their own (pure functions, no network): every
form of a credential is blanked, across any split of the stream, and decoding stays bounded."""

from __future__ import annotations

import base64
import gzip
import html
import json
import os
import zlib
from urllib.parse import quote, quote_plus

import brotli
import pytest
from backports import zstd

from sandhold.egress.decoding import PIECE, Decoder, decoder_for
from sandhold.egress.scan import Scanner
from sandhold.errors import EgressRefused
from tests.egress.leaks import leaked

SECRET = "sk-live-Q9/wE+r7=TyU~i2p"
RAW = SECRET.encode()
TEXT = b"authorization: Bearer " + RAW

FORMS = {
    "raw": TEXT,
    "upper case": TEXT.upper(),
    "base64 +0": base64.b64encode(TEXT),
    "base64 +1": base64.b64encode(b"x" + TEXT),
    "base64 +2": base64.b64encode(b"xy" + TEXT),
    "base64url": base64.urlsafe_b64encode(b"xy" + TEXT),
    "hex": TEXT.hex().encode(),
    "HEX": TEXT.hex().upper().encode(),
    "percent": quote(TEXT, safe="").encode(),
    "percent lower": quote(TEXT, safe="").lower().encode(),
    "percent plus": quote_plus(TEXT).encode(),
    "percent every byte": "".join(f"%{c:02X}" for c in TEXT).encode(),
    "json \\u": "".join(f"\\u{c:04x}" for c in RAW).encode(),
    "json \\/ (PHP)": json.dumps(SECRET).replace("/", "\\/").encode(),
    "html &#..;": "".join(f"&#{c};" for c in RAW).encode(),
    "html &#x..;": "".join(f"&#x{c:02X};" for c in RAW).encode(),
    "html escape": html.escape(SECRET).encode(),
    "utf-16": SECRET.encode("utf-16-le"),
    "mixed": b"sk%2dlive-Q9\\/wE%2Br7&#61;TyU\\u007ei2p",
}


@pytest.mark.parametrize("form", FORMS)
def test_every_form_is_blanked_in_place(form: str) -> None:
    data = b"before " + FORMS[form] + b" after"
    assert leaked(data, SECRET)  # the oracle sees it
    out = Scanner([RAW]).blank(data)
    assert len(out) == len(data) and out.startswith(b"before ") and out.endswith(b" after")
    assert not leaked(out, SECRET), out


@pytest.mark.parametrize("size", [1, 2, 3, 5, 64])
def test_a_stream_is_blanked_across_every_split(size: int) -> None:
    scanner = Scanner([RAW])
    data = b"\n".join(FORMS.values()) * 2
    r = scanner.stream()
    out = b"".join(r.feed(data[i : i + size]) for i in range(0, len(data), size)) + r.flush()
    assert out == Scanner([RAW]).blank(data) and not leaked(out, SECRET)
    assert len(out) == len(data)


def test_basic_credentials_are_scanned_decoded_too() -> None:
    basic = base64.b64encode(b"alice:correct-horse")
    out = Scanner([basic]).blank(
        b"user alice:correct-horse " + quote("alice:correct-horse").encode()
    )
    assert b"alice" not in out and b"horse" not in out


def test_ordinary_bytes_pass_untouched() -> None:
    scanner = Scanner([RAW])
    data = os.urandom(1 << 20) + b"<a href='x?a=1&amp;b=%20'>&#47;</a>" * 100
    assert scanner.blank(data) == data and scanner.blanked == 0
    assert not Scanner([]) and Scanner([b"abc"]).blank(b"abc") == b"abc"  # too short to scan


def _bomb(coding: str, mib: int) -> bytes:
    zeros = b"\0" * (1 << 20)
    if coding == "gzip":
        c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        return b"".join(c.compress(zeros) for _ in range(mib)) + c.flush()
    if coding == "br":
        return brotli.compress(zeros * mib)
    return zstd.compress(zeros * mib)


@pytest.mark.parametrize("codings", [["gzip"], ["br"], ["zstd"], ["gzip", "gzip"]])
def test_decoding_a_bomb_yields_bounded_pieces(codings: list[str]) -> None:
    body = _bomb(codings[0], 64)
    if len(codings) == 2:
        body = gzip.compress(body)
    dec = Decoder(codings)
    total = biggest = 0
    for i in range(0, len(body), 65536):
        for piece in dec.feed(body[i : i + 65536]):
            total, biggest = total + len(piece), max(biggest, len(piece))
    for piece in dec.finish():
        total += len(piece)
    assert total == 64 << 20 and biggest <= 2 * PIECE


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "zstd"])
def test_broken_or_truncated_bodies_are_errors(coding: str) -> None:
    good = {
        "gzip": gzip.compress,
        "deflate": zlib.compress,
        "br": brotli.compress,
        "zstd": zstd.compress,
    }[coding](TEXT * 100)
    dec = Decoder([coding])
    with pytest.raises(EgressRefused, match="does not decode"):
        list(dec.feed(good[: len(good) // 2]))
        list(dec.finish())
    with pytest.raises(EgressRefused, match="does not decode"):
        list(Decoder([coding]).feed(b"\x1f\x8b\x08 this is not " + coding.encode() * 20))
    assert list(Decoder([coding]).finish()) == []  # no body at all (HEAD, 304) is fine


def test_raw_deflate_and_gzip_members_decode() -> None:
    c = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    raw_deflate = c.compress(TEXT) + c.flush()
    assert b"".join(Decoder(["deflate"]).feed(raw_deflate)) == TEXT
    members = gzip.compress(b"one ") + gzip.compress(b"two")
    dec = Decoder(["x-gzip"])
    assert b"".join([*dec.feed(members), *dec.finish()]) == b"one two"


def test_codings_that_cannot_be_decoded_are_refused() -> None:
    for value in (b"compress", b"gzip, exi", b"gzip, gzip, gzip"):
        with pytest.raises(EgressRefused, match="cannot decode") as e:
            decoder_for([(b"Content-Encoding", value)], "api.example.test")
        assert e.value.status == 502
    assert decoder_for([(b"content-encoding", b"identity")], "h") is None
    assert decoder_for([(b"content-type", b"text/plain")], "h") is None


def test_a_stream_holds_back_only_what_may_begin_a_credential() -> None:
    r = Scanner([RAW]).stream()
    event = b'data: {"delta": "some text, 42 tokens"}\n\n'
    assert r.feed(event) == event  # an event stream is not delayed
    assert r.feed(b"auth: Bearer " + RAW[:5]) == b"auth: Bearer "
    assert r.feed(RAW[5:] + b"\n") == b"*" * len(RAW) + b"\n"
    assert r.feed(b"x%2") == b"x" and r.feed(b"0 y") == b"%20 y"  # an escape cut short
    begun = base64.b64encode(b"x" + RAW)[:12]  # "eH" is the x, the rest begins the credential
    assert r.feed(begun) == b"eH" and r.flush() == begun[2:]
