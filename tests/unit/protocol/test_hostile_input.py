"""Property tests of the parsers over hostile input (#19): bounded hypothesis runs in `make test`;
`python -m bench.fuzz` runs the same contracts over millions of plain random inputs.

Contracts: parse_chat_request / parse_chat_response / append_to_choices raise nothing but
ProtocolError, and what they return is valid Unicode (UTF-8-encodable); the SSE parser and relay
never raise and never lose, add or reorder a byte however the stream is chunked; decode_body
raises nothing but EncodingError and never returns more than the cap.
"""

from __future__ import annotations

import gzip
import json
import resource
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extproc.protocol.encoding import BodyTooLarge, EncodingError, decode_body
from extproc.protocol.openai import (
    ProtocolError,
    append_to_choices,
    dump_json,
    parse_chat_request,
    parse_chat_response,
)
from extproc.protocol.sse import ChatStreamRelay, SSEParser

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Text with the characters that broke things: lone surrogates (only reachable as JSON escapes),
# NUL, BOM, line separators, astral characters.
nasty_text = st.text(alphabet=st.one_of(
    st.characters(codec="utf-8"), st.sampled_from(["\ud800", "\udfff", "\x00", "\ufeff", "\u2028", "\r", "\n"])),
    max_size=20)
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
                         nasty_text)
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(nasty_text, inner, max_size=4)), max_leaves=20)
parts = st.one_of(nasty_text, st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "x"]),
                                                      "text": json_values}))
messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "developer", "tool", "function", "assistant", 3]),
     "content": st.one_of(st.none(), nasty_text, st.lists(parts, max_size=3), json_values)}), max_size=4)
requests = st.fixed_dictionaries({"messages": st.one_of(messages, json_values)}, optional={
    "model": json_values, "stream": json_values, "tools": json_values,
    "truthlens_context": st.one_of(nasty_text, st.lists(st.one_of(nasty_text, json_values), max_size=3), json_values)})
responses = st.fixed_dictionaries({"choices": st.one_of(st.lists(st.fixed_dictionaries(
    {"index": st.one_of(st.integers(0, 3), json_values),
     "message": st.one_of(st.fixed_dictionaries({"content": st.one_of(nasty_text, st.lists(parts, max_size=2),
                                                                     json_values)}), json_values)}), max_size=3),
    json_values)}, optional={"id": json_values, "model": json_values})


def ascii_json(obj: object) -> bytes:
    """ensure_ascii: how a lone surrogate travels on the wire (as an escape)."""
    return json.dumps(obj, ensure_ascii=True).encode()


def mangle(data: bytes, cut: int, junk: bytes) -> bytes:
    cut = cut % (len(data) + 1)
    return data[:cut] + junk + data[cut:]


bodies = st.one_of(
    requests.map(ascii_json),
    st.builds(mangle, requests.map(ascii_json), st.integers(0, 10_000), st.binary(max_size=4)),
    st.binary(max_size=64),
)


def valid_unicode(*texts: str | None) -> bool:
    for t in texts:
        if t is not None:
            t.encode("utf-8")  # raises on a lone surrogate
    return True


@FUZZ
@given(bodies, st.sampled_from(["truthlens_context", None]))
def test_parse_chat_request_raises_only_protocol_errors_and_returns_valid_text(body: bytes, field: str | None) -> None:
    try:
        chat = parse_chat_request(body, field)
    except ProtocolError as exc:
        if exc.upstream_body is not None:  # what would be forwarded parses and has no RAG field
            assert field not in json.loads(exc.upstream_body)
        return
    assert valid_unicode(chat.question, chat.system_prompt, *chat.context)
    if chat.upstream_body is not None:
        assert field not in json.loads(chat.upstream_body)


response_bodies = st.one_of(
    responses.map(ascii_json),
    st.builds(mangle, responses.map(ascii_json), st.integers(0, 10_000), st.binary(max_size=4)),
    st.binary(max_size=64),
)


@FUZZ
@given(response_bodies, st.one_of(nasty_text, st.dictionaries(st.integers(0, 3), nasty_text, max_size=2)))
def test_response_parsing_and_appending_raise_only_protocol_errors(body: bytes, text) -> None:
    try:
        resp = parse_chat_response(body)
    except ProtocolError:
        pass
    else:
        assert valid_unicode(resp.id, resp.model, *resp.answers)
    try:
        out = append_to_choices(body, text)
    except ProtocolError:
        return
    json.loads(out)  # what we send parses


def test_lone_surrogate_reproductions_from_the_issue() -> None:
    chat = parse_chat_request(b'{"messages":[{"role":"user","content":"\\ud800"}],"truthlens_context":"d"}')
    assert chat.question == "\ufffd" and chat.context == ("d",)
    assert chat.upstream_body == b'{"messages":[{"role":"user","content":"\\ud800"}]}'  # as the client wrote it
    assert append_to_choices(b'{"choices":[],"id":"\\ud800"}', "w") == b'{"choices":[],"id":"\\ud800"}'
    assert parse_chat_response(b'{"choices":[{"message":{"content":"a\\udc00"}}]}').answers == ("a\ufffd",)
    assert dump_json({"a": "\ud800é"}) == b'{"a":"\\ud800\\u00e9"}'


# ---- SSE ----------------------------------------------------------------------------------------

sse_pieces = st.sampled_from([b"data: ", b"data:", b"event: x", b"id: 1", b"retry: 5", b": c", b"\r\n", b"\n",
                              b"\r", b"[DONE]", b'{"choices":[{"index":0,"delta":{"content":"a\\ud800"}}]}',
                              b'{"choices":[]}', b"\xef\xbb\xbf", b"\xff", b"\xe2\x82", b"\xac"])
streams = st.lists(sse_pieces, max_size=30).map(b"".join)


@FUZZ
@given(streams, st.lists(st.integers(0, 200), max_size=8))
def test_sse_parser_events_do_not_depend_on_chunking(stream: bytes, cuts: list[int]) -> None:
    whole = SSEParser()
    expected = [(e.data, e.event, e.id, e.start, e.end) for e in whole.feed(stream) + whole.feed(b"")]
    bounds = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    p = SSEParser()
    got = []
    for a, b in zip(bounds, bounds[1:]):
        got += p.feed(stream[a:b])
    got += p.feed(b"")
    assert [(e.data, e.event, e.id, e.start, e.end) for e in got] == expected


@FUZZ
@given(streams, st.lists(st.integers(0, 200), max_size=8), st.integers(1, 64))
def test_sse_relay_forwards_every_byte_in_order(stream: bytes, cuts: list[int], max_held: int) -> None:
    bounds = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    relay = ChatStreamRelay(max_held=max_held)
    out = b"".join(relay.feed(stream[a:b]) for a, b in zip(bounds, bounds[1:])) + relay.feed(b"")
    out += relay.finish(b"")
    assert out == stream
    for i in relay.assembler.indices():
        assert valid_unicode(relay.assembler.text(i))


# ---- content encodings --------------------------------------------------------------------------

encoded = st.one_of(
    st.tuples(st.binary(max_size=200).map(gzip.compress), st.just("gzip")),
    st.tuples(st.binary(max_size=200).map(zlib.compress), st.just("deflate")),
    st.tuples(st.binary(max_size=64), st.sampled_from(["gzip", "deflate", "br", "x-gzip", "gzip, deflate", "zstd", ""])),
    st.tuples(st.builds(mangle, st.binary(max_size=200).map(gzip.compress), st.integers(0, 300),
                        st.binary(max_size=3)), st.just("gzip")),
)


@FUZZ
@given(encoded, st.integers(1, 300))
def test_decode_body_raises_only_encoding_errors_and_respects_the_cap(item: tuple[bytes, str], cap: int) -> None:
    body, coding = item
    try:
        out = decode_body(body, coding, cap)
    except EncodingError:
        return
    assert len(out) <= cap


def test_brotli_bomb_stops_at_the_cap_without_decoding_the_rest() -> None:
    """#19: a 1,640-byte br body took RSS to 2 GB before the cap applied (one-shot decoding)."""
    brotli = pytest.importorskip("brotli")
    bomb = brotli.compress(b"\0" * (256 * 1024 * 1024), quality=5)
    assert len(bomb) < 64 * 1024
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(BodyTooLarge):
        decode_body(bomb, "br", 1024 * 1024)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 64, f"decoding grew RSS by {grown_mb:.0f} MB"
    assert decode_body(brotli.compress(b'{"ok": 1}'), "br", 100) == b'{"ok": 1}'
    with pytest.raises(EncodingError):
        decode_body(brotli.compress(b"x" * 1000)[:-3], "br", 10_000)  # truncated


def test_fuzz_findings_stay_fixed() -> None:
    """What `python -m bench.fuzz` found: a surrogate's raw CESU bytes (json.loads reads bytes with
    surrogatepass), and a held blank-line CR followed by a chunk without a line break."""
    assert parse_chat_request(b'{"messages":[{"role":"user","content":"a\xed\xa0\x80"}]}').question == "a\ufffd"
    assert parse_chat_response(b'{"choices":[{"message":{"content":"\xed\xbf\xbf"}}]}').answers == ("\ufffd",)
    p = SSEParser()
    assert p.feed(b"data: x\r\r") == []
    [event] = p.feed(b"\xff")  # not an LF: the held CR was a line end of its own
    assert (event.data, event.end) == ("x", 9) and p.feed(b"") == []


def test_a_short_fuzz_run_finds_nothing() -> None:
    from bench.fuzz import run

    r = run(3000, seed=7)
    assert r["crash_total"] == 0, r["samples"]
