"""What the egress proxy looks for in everything an upstream sends back toward a sandbox: every
credential in scope of the exchange, as it is and in the forms a server that reflects requests
commonly gives it. Each match is blanked out with ``*`` of its own length, so framing and
``Content-Length`` stay right.

The forms of a credential (``_Forms``):

- itself, in any letter case, with any of its bytes escaped as a URL (``%2f``, ``+`` for a
  space), a JSON or JavaScript string (``\\u002f``, ``\\x2f``, ``\\/``) or HTML (``&#47;``,
  ``&#x2f;``, ``&quot;``), in any mix and hex case;
- base64 and base64url, at each of the three alignments it can have inside a longer encoded
  text (only the characters that depend on the credential alone, so any surrounding bytes);
- hex, in any case; UTF-16 (both byte orders);
- and when the credential is itself base64 of printable text (an HTTP Basic ``user:password``),
  that text in all of the above forms.

Escapes are found with one literal-prefixed regex each and undone into a view of the data (with
a map back to the original bytes); everything else is a plain substring search, so scanning
costs a few milliseconds per MiB and credential.

What an upstream may do beyond these (encrypt it, split it across fields, encode it twice,
answer a part of it at a time) cannot be told from other bytes: docs/security.md states it as
the trust the operator puts in a host by binding a credential to it.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import functools
import re
from collections.abc import Iterable

MIN_SCANNED = 4  # shorter values cannot be told apart from ordinary bytes
_ESCAPE_MAX = 10  # the longest escape of one byte: &#x0000ff;
_NAMED = {b"&amp;": b"&", b"&lt;": b"<", b"&gt;": b">", b"&quot;": b'"', b"&apos;": b"'"}
_BASE64_TEXT = re.compile(rb"[A-Za-z0-9+/_-]+={0,2}")
# The beginning of an escape, at the very end of the data.
_PARTIAL = re.compile(
    rb"(?:%[0-9A-Fa-f]?|\\(?:u0{0,2}[0-9A-Fa-f]?|x[0-9A-Fa-f]?)?"
    rb"|&(?:#(?:[xX]0{0,4}[0-9A-Fa-f]{0,2}|0{0,4}[0-9]{0,3})|[a-z]{0,4})?)\Z"
)


def _unescape(token: bytes) -> int | None:
    """The byte an escape stands for."""
    if token == b"+":
        return 0x20
    if token in _NAMED:
        return _NAMED[token][0]
    if token.startswith(b"&#x") or token.startswith(b"&#X"):
        return int(token[3:-1], 16)
    if token.startswith(b"&#"):
        n = int(token[2:-1])
        return n if n < 256 else None
    if token.startswith(b"%"):
        return int(token[1:], 16)
    if token.startswith((b"\\u", b"\\x")):
        return int(token[-2:], 16)
    return token[1]  # a backslash-escaped punctuation byte


def _base64_cores(value: bytes) -> list[bytes]:
    """The base64 and base64url characters that encode ``value`` at offset 0, 1 and 2 of a
    longer text, without the characters its neighbours share."""
    cores = []
    for o in range(3):
        enc = base64.b64encode(b"\0" * o + value)
        core = enc[(8 * o + 5) // 6 : 8 * (o + len(value)) // 6]
        if len(core) >= MIN_SCANNED:
            cores += [core, core.replace(b"+", b"-").replace(b"/", b"_")]
    return cores


def _decoded(value: bytes) -> bytes | None:
    """The printable text ``value`` is base64 of, if it is (HTTP Basic credentials)."""
    if not _BASE64_TEXT.fullmatch(value):
        return None
    text = value.rstrip(b"=")
    try:
        raw = base64.urlsafe_b64decode(
            text.replace(b"+", b"-").replace(b"/", b"_") + b"=" * (-len(text) % 4)
        )
    except (binascii.Error, ValueError):
        return None
    if len(raw) < 6 or not all(0x20 <= c < 0x7F for c in raw):
        return None
    return raw


class _Forms:
    """What to look for, for one set of credentials."""

    def __init__(self, values: tuple[bytes, ...]) -> None:
        vals = [v for v in values if len(v) >= MIN_SCANNED]
        vals += [d for v in vals if (d := _decoded(v)) is not None and d not in vals]
        self.texts = [v.lower() for v in vals]  # in the unescaped, lowercased view
        self.exact = [c for v in vals for c in _base64_cores(v)]
        for v in vals:
            t = v.decode("latin-1")
            self.exact += [t.encode("utf-16-le"), t.encode("utf-16-be")]
        self.hex = [v.hex().encode() for v in vals]  # in the lowercased data
        self.bytes = {b for v in vals for b in v.lower() + v.upper()}
        self.escapes = _escapes(self.bytes)
        self.longest = max((_ESCAPE_MAX * len(v) for v in vals), default=0)

    def spans(self, data: bytes) -> list[tuple[int, int]]:
        """Where in ``data`` a form of a credential stands, as (start, end)."""
        out: list[tuple[int, int]] = []
        for needle in self.exact:
            out += _find(data, needle)
        lowered = data.lower()
        for needle in self.hex:
            out += _find(lowered, needle)
        view, tokens = self._unescaped(data)
        lowered_view = view.lower() if tokens else lowered
        for needle in self.texts:
            for ds, de in _find(lowered_view, needle):
                out.append((_where(tokens, ds)[0], _where(tokens, de - 1)[1]))
        return out

    def pending(self, data: bytes) -> int:
        """Where the last form of a credential that ``data`` starts but does not finish may
        begin (``len(data)`` if none): what a stream must hold back, and no more, so a stream of
        events (an LLM's answer) is not delayed by the scan."""
        n, start = len(data), len(data)
        lowered = data.lower()
        for needle, hay in [(x, data) for x in self.exact] + [(h, lowered) for h in self.hex]:
            start = min(start, n - _overlap(hay, needle))
        base = max(n - self.longest, 0)
        tail = data[base:]
        # an escape cut short at the very end: it may be the credential's next byte
        m = _PARTIAL.search(tail, max(len(tail) - _ESCAPE_MAX, 0))
        cut = m.start() if m else len(tail)
        if cut < len(tail):
            start = min(start, base + cut)
        view, tokens = self._unescaped(tail[:cut])
        low = view.lower()
        for text in self.texts:
            k = _overlap(low, text)
            if k:
                start = min(start, base + _where(tokens, len(low) - k)[0])
        return start

    def _unescaped(self, data: bytes) -> tuple[bytes, list[tuple[int, int, int]]]:
        """``data`` with the escapes of credential bytes replaced by those bytes, and for each
        one (its index in the view, its start and end in ``data``)."""
        found = sorted(m.span() for r in self.escapes for m in r.finditer(data))
        if not found:
            return data, []
        parts, tokens, pos, vlen = [], [], 0, 0
        for start, end in found:
            b = _unescape(data[start:end])
            if b is None or b not in self.bytes or start < pos:
                continue
            parts.append(data[pos:start])
            vlen += start - pos
            tokens.append((vlen, start, end))
            parts.append(bytes([b]))
            vlen += 1
            pos = end
        parts.append(data[pos:])
        return b"".join(parts), tokens


def _escapes(wanted: set[int]) -> list[re.Pattern[bytes]]:
    """Regexes for the escapes of the bytes in ``wanted``, one per first byte (a literal first
    byte keeps the search fast)."""
    if not wanted:
        return []
    hexes = b"|".join(f"{b:02x}".encode() for b in sorted(wanted))
    short = b"|".join((f"{b:x}").encode() for b in sorted(wanted))
    decimal = b"|".join(str(b).encode() for b in sorted(wanted))
    punct = b"".join(re.escape(bytes([b])) for b in sorted(wanted) if not bytes([b]).isalnum())
    named = b"".join(b"|" + n[1:-1] for n, c in _NAMED.items() if c[0] in wanted)
    out = [
        re.compile(b"%(?i:" + hexes + b")"),
        re.compile(
            rb"\\(?:u00(?i:"
            + hexes
            + b")|x(?i:"
            + hexes
            + b")"
            + (b"|[" + punct + b"]" if punct else b"")
            + b")"
        ),
        re.compile(
            b"&(?:#[xX]0{0,4}(?i:" + short + b")|#0{0,4}(?:" + decimal + b")" + named + b");"
        ),
    ]
    if 0x20 in wanted:
        out.append(re.compile(rb"\+"))
    return out


def _overlap(data: bytes, needle: bytes) -> int:
    """The length of the longest end of ``data`` that begins ``needle`` (shorter than it)."""
    for k in range(min(len(needle) - 1, len(data)), 0, -1):
        if data.endswith(needle[:k]):
            return k
    return 0


def _find(data: bytes, needle: bytes) -> list[tuple[int, int]]:
    out, i = [], data.find(needle)
    while i >= 0:
        out.append((i, i + len(needle)))
        i = data.find(needle, i + 1)
    return out


def _where(tokens: list[tuple[int, int, int]], i: int) -> tuple[int, int]:
    """The span in the original data of byte ``i`` of the unescaped view."""
    k = bisect.bisect_right(tokens, (i, 1 << 62, 0)) - 1
    if k < 0:
        return i, i + 1
    vi, start, end = tokens[k]
    if vi == i:
        return start, end
    o = end + (i - vi - 1)
    return o, o + 1


@functools.lru_cache(maxsize=64)
def _compile(values: tuple[bytes, ...]) -> _Forms:
    return _Forms(values)


class Scanner:
    """The credentials in scope of one exchange (what to look for is built once per set)."""

    def __init__(self, values: Iterable[bytes]) -> None:
        self.forms = _compile(tuple(sorted(set(values))))
        self.longest = self.forms.longest
        self.blanked = 0  # matches blanked so far (the audit log counts them)

    def __bool__(self) -> bool:
        return self.longest > 0

    def blank(self, data: bytes) -> bytes:
        """``data`` with every form of every credential blanked out."""
        if not self or not data:
            return data
        spans = self.forms.spans(data)
        if not spans:
            return data
        self.blanked += len(spans)
        out = bytearray(data)
        for start, end in spans:
            out[start:end] = b"*" * (end - start)
        return bytes(out)

    def stream(self) -> Redactor:
        return Redactor(self)


class Redactor:
    """Blanks a stream (a body, across its chunks): it holds back only the end of what it got
    that may begin a form of a credential, until the next piece or the end shows whether it
    does."""

    def __init__(self, scanner: Scanner) -> None:
        self.scanner = scanner
        self.buf = b""

    def feed(self, data: bytes) -> bytes:
        if not self.scanner:
            return data
        buf = self.scanner.blank(self.buf + data)
        cut = self.scanner.forms.pending(buf)
        self.buf = buf[cut:]
        return buf[:cut]

    def flush(self) -> bytes:
        out, self.buf = self.buf, b""
        return out
