"""Incremental SSE parsing, stream assembly and relay, checked against the real OpenAI client."""

from __future__ import annotations

import json

import openai
import openai._base_client
import pytest
from openai.types.chat import ChatCompletionChunk

from extproc.protocol.sse import (
    ChatStreamAssembler,
    ChatStreamRelay,
    SSEEvent,
    SSEParser,
    content_delta_chunk,
    format_event,
    verdict_chunk,
)


# The HTTP library the installed openai SDK is built on (httpx2 for openai 3.x, httpx before).
http_lib = getattr(openai._base_client, "httpx2", None) or openai._base_client.httpx


def _chunk(content=None, index=0, finish=None, **extra) -> dict:
    delta = {} if content is None else {"content": content}
    return {"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 7, "model": "gpt-x",
            "choices": [{"index": index, "delta": delta, "finish_reason": finish}], **extra}


def _stream(*chunks: dict, done: bool = True, sep: str = "\n") -> bytes:
    out = "".join(f"data: {json.dumps(c, ensure_ascii=False)}{sep}{sep}" for c in chunks)
    if done:
        out += f"data: [DONE]{sep}{sep}"
    return out.encode()


def _parse_all(pieces) -> list[SSEEvent]:
    parser = SSEParser()
    events: list[SSEEvent] = []
    for piece in pieces:
        events.extend(parser.feed(piece))
    return events


TRICKY = (
    b"\xef\xbb\xbf: comment line\r\n"
    b"retry: 3000\r\n"
    b"id: 41\r\n"
    b"data: first line\r\n"
    b"data:second line\r\n"
    b"\r\n"
    b"event: custom\rdata: caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\r\r"
    b"data\n"
    b"data: \n"
    b"\n"
    b"id: bad\x00id\n"
    b"unknown: field\n"
    b"data: {\"a\": 1}\n"
    b"\n"
    b"data: never terminated"
)

TRICKY_EVENTS = [
    ("first line\nsecond line", None, "41"),
    ("caf\u00e9 \u20ac \U0001F600", "custom", "41"),
    ("\n", None, "41"),
    ('{"a": 1}', None, "41"),
]


def _summary(events):
    return [(e.data, e.event, e.id) for e in events]


def test_whatwg_fields_comments_line_endings_in_one_chunk():
    parser = SSEParser()
    assert _summary(parser.feed(TRICKY)) == TRICKY_EVENTS
    assert parser.retry == 3000
    assert parser.incomplete  # the unterminated tail is not dispatched (spec: discarded at EOF)


@pytest.mark.parametrize("cut", range(1, len(TRICKY)))
def test_every_two_way_split_gives_the_same_events(cut):
    assert _summary(_parse_all([TRICKY[:cut], TRICKY[cut:]])) == TRICKY_EVENTS


def test_byte_by_byte_and_offsets():
    events = _parse_all(TRICKY[i:i + 1] for i in range(len(TRICKY)))
    assert _summary(events) == TRICKY_EVENTS
    whole = SSEParser().feed(TRICKY)
    assert [e.start for e in events] == [e.start for e in whole]
    # a blank line's CR at a chunk's end waits for the next byte: ends agree however the CRLF is split (#19)
    assert [e.end for e in events] == [e.end for e in whole]
    # blocks tile the stream: each event's block starts where a previous block ended
    assert events[0].start == 0
    assert TRICKY[events[1].start:events[1].end].startswith(b"event: custom")


def test_crlf_split_between_chunks_is_one_line_end():
    events = _parse_all([b"data: a\r", b"\n\r", b"\ndata: b\r\n\r\n"])
    assert _summary(events) == [("a", None, None), ("b", None, None)]
    assert events[1].start == 11  # the LF after the blank line's CR belongs to the first block


def test_format_event_round_trips_multiline_data_and_event_name():
    raw = format_event("line1\nline2\r\nline3", event="verdict")
    assert raw == b"event: verdict\ndata: line1\ndata: line2\ndata: line3\n\n"
    assert _summary(SSEParser().feed(raw)) == [("line1\nline2\nline3", "verdict", None)]
    with pytest.raises(ValueError):
        format_event("x", event="a\nb")


def test_assembler_accumulates_per_choice_and_counts_oddities():
    raw = (
        _stream(_chunk("Hel"), _chunk("Bon", index=1), done=False)
        + b"data: not json\n\n"
        + b": keep-alive\n\n"
        + _stream(_chunk("lo", finish="stop"), _chunk("jour", index=1),
                  {"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 7, "model": "gpt-x",
                   "choices": [{"index": 2, "delta": {"tool_calls": [{"index": 0, "id": "t"}]}}]},
                  {"id": "chatcmpl-9", "choices": [], "usage": {"total_tokens": 5}})
        + b"data: {\"late\": true}\n\n"
    )
    asm = ChatStreamAssembler()
    for event in SSEParser().feed(raw):
        asm.add(event)
    assert asm.answers() == ("Hello", "Bonjour", None)
    assert asm.indices() == (0, 1, 2)
    assert (asm.id, asm.model, asm.created) == ("chatcmpl-9", "gpt-x", 7)
    assert asm.done
    assert asm.ignored == 2  # the non-JSON event and the event after [DONE]
    assert asm.finish_reasons == {0: "stop"}
    assert asm.chars == len("HelloBonjour")


def test_assembler_records_in_stream_error():
    asm = ChatStreamAssembler()
    asm.add_data('{"error": {"message": "overloaded"}}')
    assert asm.error == {"message": "overloaded"} and asm.answers() == ()


STREAM = _stream(_chunk("Der "), _chunk("Himmel "), _chunk("ist grün. \u00e9\U0001F600", finish="stop"))


@pytest.mark.parametrize("cut", range(1, len(STREAM)))
def test_relay_split_anywhere_forwards_everything_and_holds_done(cut):
    relay = ChatStreamRelay()
    forwarded = relay.feed(STREAM[:cut]) + relay.feed(STREAM[cut:])
    assert relay.done
    assert relay.assembler.answers() == ("Der Himmel ist grün. \u00e9\U0001F600",)
    assert forwarded == STREAM[: STREAM.index(b"data: [DONE]")]
    insert = verdict_chunk({"status": "checked"})
    assert forwarded + relay.finish(insert) == STREAM.replace(b"data: [DONE]", insert + b"data: [DONE]")


def test_relay_forwards_complete_blocks_immediately_and_holds_partial_tail():
    relay = ChatStreamRelay()
    first = _stream(_chunk("a"), done=False)
    assert relay.feed(first + b"data: {\"par") == first
    assert relay.feed(b"tial\": 1}\n") == b""
    assert relay.feed(b"\n: ping\n\n") == b'data: {"partial": 1}\n\n: ping\n\n'


def test_relay_without_done_puts_insert_before_unterminated_tail():
    relay = ChatStreamRelay()
    body = _stream(_chunk("x"), done=False)
    assert relay.feed(body + b"data: {\"cut") == body
    assert relay.finish(b"<V>") == b"<V>data: {\"cut"
    assert not relay.done


def test_relay_crlf_stream():
    raw = _stream(_chunk("a"), _chunk("b"), sep="\r\n")
    relay = ChatStreamRelay()
    out = b"".join(relay.feed(raw[i:i + 3]) for i in range(0, len(raw), 3))
    assert out == raw[: raw.index(b"data: [DONE]")]
    assert relay.assembler.answers() == ("ab",)


def test_relay_flushes_oversized_unterminated_block():
    relay = ChatStreamRelay(max_held=64)
    blob = b"data: " + b"x" * 100
    assert relay.feed(blob) == blob


def _openai_stream(body: bytes) -> list[ChatCompletionChunk]:
    def handler(request):
        return http_lib.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    client = openai.OpenAI(api_key="test", base_url="http://upstream.test/v1",
                           http_client=http_lib.Client(transport=http_lib.MockTransport(handler)))
    stream = client.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "q"}], stream=True)
    return list(stream)


def test_verdict_and_warning_chunks_parse_with_the_real_openai_client():
    relay = ChatStreamRelay()
    forwarded = relay.feed(STREAM)
    a = relay.assembler
    insert = (content_delta_chunk(0, "\n[TruthLens] warning", id=a.id, model=a.model, created=a.created)
              + verdict_chunk({"status": "checked", "score": 0.81, "spans": [{"start": 4, "end": 10}]},
                              id=a.id, model=a.model, created=a.created))
    chunks = _openai_stream(forwarded + relay.finish(insert))
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Der Himmel ist grün. \u00e9\U0001F600\n[TruthLens] warning"
    last = chunks[-1]
    assert last.choices == [] and last.id == "chatcmpl-9" and last.model == "gpt-x"
    assert last.model_extra["truthlens"] == {"status": "checked", "score": 0.81, "spans": [{"start": 4, "end": 10}]}


def test_verdict_chunk_validates_as_chat_completion_chunk():
    payload = SSEParser().feed(verdict_chunk({"status": "unchecked", "reason": "no_context"}))[0].data
    chunk = ChatCompletionChunk.model_validate_json(payload)  # strict pydantic validation, not just construct()
    assert chunk.object == "chat.completion.chunk" and chunk.choices == []
    assert chunk.model_extra == {"truthlens": {"status": "unchecked", "reason": "no_context"}}


def test_relay_after_finish_passes_later_chunks_and_never_repeats_the_verdict():
    relay = ChatStreamRelay()
    forwarded = relay.feed(STREAM)
    assert relay.done and not relay.finished
    tail = relay.finish(b"<V>")
    assert relay.finished and tail == b"<V>data: [DONE]\n\n"
    assert forwarded + tail == STREAM.replace(b"data: [DONE]", b"<V>data: [DONE]")
    assert relay.feed(b"") == b""  # Envoy's final empty end_of_stream chunk
    assert relay.feed(b": trailing\n\n") == b": trailing\n\n"
    assert relay.finish(b"<V again>") == b""


def _client_pair(body: bytes) -> tuple[openai.OpenAI, openai.AsyncOpenAI]:
    def handler(request):
        return http_lib.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    transport = http_lib.MockTransport(handler)
    return (openai.OpenAI(api_key="t", base_url="http://u.test/v1", http_client=http_lib.Client(transport=transport)),
            openai.AsyncOpenAI(api_key="t", base_url="http://u.test/v1",
                               http_client=http_lib.AsyncClient(transport=transport)))


async def test_stream_helper_and_async_client_accept_warning_after_finish_and_verdict():
    relay = ChatStreamRelay()
    forwarded = relay.feed(STREAM)  # the last content chunk already carries finish_reason "stop"
    a = relay.assembler
    body = forwarded + relay.finish(content_delta_chunk(0, " [warn]", id=a.id, model=a.model, created=a.created)
                                    + verdict_chunk({"status": "detected"}, id=a.id, model=a.model, created=a.created))
    sync_client, async_client = _client_pair(body)
    with sync_client.chat.completions.stream(model="gpt-x", messages=[{"role": "user", "content": "q"}]) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert final.choices[0].message.content == "Der Himmel ist grün. \u00e9\U0001F600 [warn]"
    chunks = [c async for c in await async_client.chat.completions.create(
        model="gpt-x", messages=[{"role": "user", "content": "q"}], stream=True)]
    assert chunks[-1].choices == [] and chunks[-1].model_extra == {"truthlens": {"status": "detected"}}


def test_assembler_reads_what_the_fast_json_reader_rejects_like_json_loads():
    asm = ChatStreamAssembler()
    asm.add_data('{"choices": [{"index": 0, "delta": {"content": "Hi \\ud800"}}], "x": NaN}')
    asm.add_data('{"choices": [{"index": 0, "delta": {"content": "!"}}]}')
    asm.add_data("{broken")
    assert asm.answers() == ("Hi \ufffd!",) and asm.ignored == 1  # a lone surrogate reads as U+FFFD (#19)


@pytest.mark.parametrize("stream", [b"data: a\r\n\r\ndata: b\r\n\r\n", b"data: a\r\rdata: b\r\r", b"data: a\n\r\n"])
def test_event_ends_do_not_depend_on_where_a_crlf_is_split(stream):
    """The fuzzer's case (#19): `end` was one short when a blank line's CRLF was split across chunks."""
    whole = SSEParser()
    expected = whole.feed(stream) + whole.feed(b"")
    for cut in range(1, len(stream)):
        p = SSEParser()
        got = p.feed(stream[:cut]) + p.feed(stream[cut:]) + p.feed(b"")
        assert [(e.data, e.start, e.end) for e in got] == [(e.data, e.start, e.end) for e in expected]
        assert p.boundary == whole.boundary


def test_a_stream_ending_in_a_lone_cr_dispatches_at_the_empty_end_chunk():
    p = SSEParser()
    assert p.feed(b"data: x\r\r") == []
    [event] = p.feed(b"")
    assert (event.data, event.end, p.boundary) == ("x", 9, 9)
