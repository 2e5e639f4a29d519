"""Content codings of responses the proxy scans: a body that arrives compressed although the proxy
asked for ``identity`` is decoded, so that it can be scanned, and forwarded decoded; one in a
coding the proxy cannot decode is refused. It is never forwarded unscanned.

Decoding is bounded: each step yields at most about ``PIECE`` bytes (zlib's ``max_length``,
brotli's ``output_buffer_limit``, zstd's ``max_length``) and the caller writes and drains each
before asking for the next, so a decompression bomb costs time, never memory. Windows are bounded
too: zlib's 32 KiB, brotli's 16 MiB (large windows are not enabled), zstd's 8 MiB (as RFC 9659
asks of HTTP; a frame that wants more is an error), and at most ``MAX_CODINGS`` are stacked.
"""

from __future__ import annotations

import sys
import zlib
from collections.abc import Iterable, Iterator

import brotli

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

from sandhold.egress.refusal import refused
from sandhold.errors import EgressRefused

PIECE = 64 * 1024
MAX_CODINGS = 2
CODINGS = ("gzip", "x-gzip", "deflate", "br", "zstd")


def _broken(why: object) -> EgressRefused:
    """The body is not what its Content-Encoding says, or ends early."""
    return refused(502, f"the compressed body does not decode: {why}", "encoding")


class _Zlib:
    def __init__(self, gzip: bool) -> None:
        self.gzip = gzip
        self.d: zlib._Decompress | None = None
        self.head = b""  # deflate: the first bytes, to tell zlib from raw deflate
        self.done = False
        self.fed = False

    def _new(self, data: bytes) -> zlib._Decompress:
        if self.gzip:
            return zlib.decompressobj(16 + zlib.MAX_WBITS)
        # RFC 9110 deflate is zlib-wrapped; some servers send raw deflate.
        wrapped = data[0] & 0x0F == 8 and ((data[0] << 8) | data[1]) % 31 == 0
        return zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)

    def feed(self, data: bytes) -> Iterator[bytes]:
        self.fed = self.fed or bool(data)
        if self.d is None:
            data = self.head + data
            if len(data) < 2:
                self.head = data
                return
            self.d = self._new(data)
        pending = False  # a full piece came out: more may wait without more input
        while not self.done and (data or pending):
            try:
                out = self.d.decompress(data, PIECE)
            except zlib.error as e:
                raise _broken(e) from None
            if out:
                yield out
            pending = len(out) == PIECE
            if self.d.eof:
                data = self.d.unused_data
                # gzip may hold several members; anything else after the end is dropped
                if self.gzip and data[:2] == b"\x1f\x8b":
                    self.d = self._new(data)
                else:
                    self.done = True
            else:
                data = self.d.unconsumed_tail

    def finish(self) -> Iterator[bytes]:
        if self.fed and not self.done:
            raise _broken("it ended early")
        return iter(())


class _Brotli:
    def __init__(self) -> None:
        self.d = brotli.Decompressor()
        self.fed = False

    def feed(self, data: bytes) -> Iterator[bytes]:
        self.fed = self.fed or bool(data)
        if self.d.is_finished():
            return  # anything after the end is dropped
        try:
            out = self.d.process(data, output_buffer_limit=PIECE)
            while True:
                if out:
                    yield out
                if self.d.is_finished() or (not out and self.d.can_accept_more_data()):
                    return
                out = self.d.process(b"", output_buffer_limit=PIECE)
        except brotli.error as e:
            raise _broken(e) from None

    def finish(self) -> Iterator[bytes]:
        if self.fed and not self.d.is_finished():
            raise _broken("it ended early")
        return iter(())


class _Zstd:
    def __init__(self) -> None:
        self.d = self._new()
        self.fed = False

    @staticmethod
    def _new() -> zstd.ZstdDecompressor:
        return zstd.ZstdDecompressor(options={zstd.DecompressionParameter.window_log_max: 23})

    def feed(self, data: bytes) -> Iterator[bytes]:
        self.fed = self.fed or bool(data)
        try:
            while True:
                if self.d.eof:  # a body may hold several frames
                    data = self.d.unused_data + data
                    if not data:
                        return
                    self.d = self._new()
                out = self.d.decompress(data, max_length=PIECE)
                data = b""
                if out:
                    yield out
                if not self.d.eof and self.d.needs_input:
                    return
        except zstd.ZstdError as e:
            raise _broken(e) from None

    def finish(self) -> Iterator[bytes]:
        if self.fed and not self.d.eof:
            raise _broken("it ended early")
        return iter(())


def _stage(coding: str) -> _Zlib | _Brotli | _Zstd:
    if coding in ("gzip", "x-gzip"):
        return _Zlib(gzip=True)
    if coding == "deflate":
        return _Zlib(gzip=False)
    return _Brotli() if coding == "br" else _Zstd()


class Decoder:
    """The codings of one body, undone in reverse order of their application."""

    def __init__(self, codings: list[str]) -> None:
        self.stages = [_stage(c) for c in reversed(codings)]

    def feed(self, data: bytes) -> Iterator[bytes]:
        return self._through(0, [data])

    def finish(self) -> Iterator[bytes]:
        return self._through(0, [], final=True)

    def _through(self, i: int, pieces: Iterable[bytes], final: bool = False) -> Iterator[bytes]:
        if i == len(self.stages):
            yield from pieces
            return
        stage = self.stages[i]
        for piece in pieces:
            yield from self._through(i + 1, stage.feed(piece))
        if final:
            yield from self._through(i + 1, stage.finish(), final=True)


def codings(headers: Iterable[tuple[bytes, bytes]]) -> list[str]:
    """The content codings a response names, in the order they were applied (identity left
    out)."""
    out = []
    for k, v in headers:
        if k.lower() == b"content-encoding":
            out += [t.strip().lower() for t in v.decode("latin-1").split(",") if t.strip()]
    return [c for c in out if c != "identity"]


def decoder_for(headers: Iterable[tuple[bytes, bytes]], host: str) -> Decoder | None:
    """A decoder for a response's body, None for identity; a 502 refusal for a coding the proxy
    cannot decode (so cannot scan)."""
    names = codings(headers)
    if not names:
        return None
    unknown = [c for c in names if c not in CODINGS]
    if unknown or len(names) > MAX_CODINGS:
        raise refused(
            502,
            f"{host} answered with Content-Encoding {', '.join(names)!r}, which the egress proxy "
            "cannot decode to scan for credentials (it asks for identity)",
            "encoding",
        )
    return Decoder(names)
