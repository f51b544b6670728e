"""Content-encoding decoding and its size guard."""

from __future__ import annotations

import gzip
import json
import zlib

import pytest

from extproc.protocol.encoding import (
    BodyTooLarge,
    CorruptBody,
    UnsupportedEncoding,
    decode_body,
    supported_encodings,
)
from extproc.protocol.openai import parse_chat_response

BODY = json.dumps({"id": "c", "choices": [{"index": 0, "message": {"content": "Grün ist der Himmel."}}]}).encode()


def test_gzip_response_is_still_judged():
    decoded = decode_body(gzip.compress(BODY), "gzip", 1 << 20)
    assert parse_chat_response(decoded).answers == ("Grün ist der Himmel.",)
    assert decode_body(gzip.compress(BODY), "X-GZIP", 1 << 20) == BODY


def test_multi_member_gzip_and_stacked_codings():
    two = gzip.compress(BODY[:10]) + gzip.compress(BODY[10:])
    assert decode_body(two, "gzip", 1 << 20) == BODY
    stacked = gzip.compress(zlib.compress(BODY))  # deflate applied first, then gzip
    assert decode_body(stacked, "deflate, gzip", 1 << 20) == BODY


def test_deflate_zlib_wrapped_and_raw():
    assert decode_body(zlib.compress(BODY), "deflate", 1 << 20) == BODY
    raw = zlib.compressobj(wbits=-15)
    assert decode_body(raw.compress(BODY) + raw.flush(), "deflate", 1 << 20) == BODY


@pytest.mark.parametrize("header", [None, "", "identity", " Identity "])
def test_identity_is_unchanged(header):
    assert decode_body(BODY, header, 1 << 20) is BODY


def test_decompression_bomb_is_refused_without_inflating_it():
    bomb = gzip.compress(b"\0" * (50 << 20))  # 50 MiB of zeros in ~50 KiB
    assert len(bomb) < 100_000
    with pytest.raises(BodyTooLarge, match="exceeds 1048576"):
        decode_body(bomb, "gzip", 1 << 20)
    with pytest.raises(BodyTooLarge):
        decode_body(b"x" * 11, "identity", 10)


def test_exact_limit_is_allowed():
    assert decode_body(gzip.compress(b"a" * 100), "gzip", 100) == b"a" * 100
    with pytest.raises(BodyTooLarge):
        decode_body(gzip.compress(b"a" * 101), "gzip", 100)


@pytest.mark.parametrize("body", [b"not gzip at all", gzip.compress(BODY)[:-12], gzip.compress(BODY) + b"junk"])
def test_corrupt_or_truncated_gzip(body):
    with pytest.raises(CorruptBody):
        decode_body(body, "gzip", 1 << 20)


def test_unsupported_codings_are_named():
    with pytest.raises(UnsupportedEncoding, match="zstd"):
        decode_body(BODY, "zstd", 1 << 20)
    if "br" not in supported_encodings():
        with pytest.raises(UnsupportedEncoding, match="brotli"):
            decode_body(BODY, "br", 1 << 20)
