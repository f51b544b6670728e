"""Content-Encoding decoding for bodies the firewall must read, with a decompression-bomb guard.

Public API:

- ``decode_body(body, content_encoding, max_bytes) -> bytes``
- ``supported_encodings() -> frozenset[str]``
- ``EncodingError`` (base), ``UnsupportedEncoding``, ``BodyTooLarge``, ``CorruptBody``.

Upstream is asked for ``accept-encoding: identity``, so this is the fallback for servers that
compress anyway. On any ``EncodingError`` the gateway marks the response unchecked and passes
the original bytes through untouched. If it judges a decoded body and rewrites it, it sends
the decoded bytes and removes ``content-encoding``. ``br`` works only when a Brotli module
(``brotli`` or ``brotlicffi``) is already installed (nothing is added for it). Every coding is
decoded incrementally and stops at the size cap (brotli >= 1.2 bounds its own output buffer;
older modules are fed 64-byte slices). Decoding is CPU work: the gateway runs it in a worker
thread (``asyncio.to_thread``), never on the event loop.
"""

from __future__ import annotations

import zlib
from types import ModuleType

__all__ = [
    "BodyTooLarge",
    "CorruptBody",
    "EncodingError",
    "UnsupportedEncoding",
    "decode_body",
    "supported_encodings",
]

_GZIP_WBITS = 16 + zlib.MAX_WBITS
_ZLIB_WBITS = zlib.MAX_WBITS
_RAW_DEFLATE_WBITS = -zlib.MAX_WBITS
_IDENTITY = frozenset({"", "identity"})


class EncodingError(ValueError):
    """The body cannot be decoded into something we may judge."""


class UnsupportedEncoding(EncodingError):
    pass


class BodyTooLarge(EncodingError):
    pass


class CorruptBody(EncodingError):
    pass


def _load_brotli() -> ModuleType | None:
    for name in ("brotli", "brotlicffi"):
        try:
            return __import__(name)
        except ImportError:
            continue
    return None


_BROTLI = _load_brotli()


def supported_encodings() -> frozenset[str]:
    names = {"identity", "gzip", "x-gzip", "deflate"}
    if _BROTLI is not None:
        names.add("br")
    return frozenset(names)


def _inflate(data: bytes, wbits: int, limit: int, name: str) -> bytes:
    """Decompress every member (gzip allows several), never producing more than `limit` + 1 bytes."""
    out = bytearray()
    while True:
        decomp = zlib.decompressobj(wbits)
        try:
            out += decomp.decompress(data, limit + 1 - len(out))
        except zlib.error as exc:
            raise CorruptBody(f"{name} body is corrupt: {exc}") from None
        if len(out) > limit:
            raise BodyTooLarge(f"decoded {name} body exceeds {limit} bytes")
        if decomp.unconsumed_tail:  # stopped by the size cap with input left
            raise BodyTooLarge(f"decoded {name} body exceeds {limit} bytes")
        if not decomp.eof:
            raise CorruptBody(f"{name} body is truncated")
        data = decomp.unused_data
        if not data or wbits != _GZIP_WBITS:
            if data.strip(b"\x00"):
                raise CorruptBody(f"{name} body has trailing garbage")
            return bytes(out)


_BROTLI_SLICE = 64  # input bytes per step where the module cannot bound its output itself


def _brotli(data: bytes, limit: int) -> bytes:
    """Incremental: never holds much more than `limit` decoded bytes (a 1.6 kB body can expand to GBs)."""
    if _BROTLI is None:
        raise UnsupportedEncoding("content-encoding br needs the brotli module, which is not installed")
    dec = _BROTLI.Decompressor()
    out = bytearray()
    too_large = BodyTooLarge(f"decoded br body exceeds {limit} bytes")
    try:
        try:  # brotli >= 1.2: the output buffer itself stops at the cap
            out += dec.process(data, output_buffer_limit=limit + 1)
            while len(out) <= limit and not dec.can_accept_more_data():
                out += dec.process(b"", output_buffer_limit=limit + 1 - len(out))
        except TypeError:  # older brotli, brotlicffi: feed small slices, check the cap after each
            step = getattr(dec, "process", None) or dec.decompress
            for i in range(len(out), len(data), _BROTLI_SLICE):
                out += step(data[i:i + _BROTLI_SLICE])
                if len(out) > limit:
                    raise too_large from None
        finished = dec.is_finished()
    except BodyTooLarge:
        raise
    except Exception as exc:  # brotli raises its own error types
        raise CorruptBody(f"br body is corrupt: {exc}") from None
    if len(out) > limit:
        raise too_large
    if not finished:
        raise CorruptBody("br body is truncated")
    return bytes(out)


def _decode_one(data: bytes, coding: str, limit: int) -> bytes:
    if coding in _IDENTITY:
        return data
    if coding in ("gzip", "x-gzip"):
        return _inflate(data, _GZIP_WBITS, limit, coding)
    if coding == "deflate":
        # RFC 9110 deflate is zlib-wrapped; some servers send raw deflate anyway.
        try:
            return _inflate(data, _ZLIB_WBITS, limit, coding)
        except CorruptBody:
            return _inflate(data, _RAW_DEFLATE_WBITS, limit, coding)
    if coding == "br":
        return _brotli(data, limit)
    raise UnsupportedEncoding(f"content-encoding {coding!r} is not supported")


def decode_body(body: bytes, content_encoding: str | None, max_bytes: int) -> bytes:
    """Undo every listed coding (last applied first); the result is at most `max_bytes` long."""
    codings = [c.strip().lower() for c in (content_encoding or "").split(",")]
    codings = [c for c in codings if c not in _IDENTITY]
    if not codings:
        if len(body) > max_bytes:
            raise BodyTooLarge(f"body exceeds {max_bytes} bytes")
        return body
    data = body
    for coding in reversed(codings):
        data = _decode_one(data, coding, max_bytes)
    return data
