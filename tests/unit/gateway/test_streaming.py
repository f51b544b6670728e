"""SseStream: which chunk replies go when, and what they carry (the sidecar never keeps a byte)."""

from __future__ import annotations

import asyncio

import pytest

from extproc.devtools.demo_upstream import completion_sse_chunks
from extproc.gateway.streaming import SseStream, StreamOutcome
from extproc.inference.api import DetectionResult, Overloaded, Span

CLOSE = b"data: {\"closing\":true}\n\n"
ANSWER = "The tower is 330 metres tall. It opened in 1889. Oslo built a copy in 1990. It is made of iron."


class Checks:
    """A sentence check double: sentences that mention Oslo are flagged (score 0.9), the rest 0.05."""

    def __init__(self, fail: BaseException | None = None, gate: asyncio.Event | None = None) -> None:
        self.seen: list[str] = []
        self.fail, self.gate = fail, gate

    async def __call__(self, sentence: str) -> DetectionResult:
        self.seen.append(sentence)
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        if "Oslo" in sentence:
            return DetectionResult(0.9, (Span(0, len(sentence), sentence, 0.9, 3),), signals=("detector",))
        return DetectionResult(0.05, (), signals=("detector",))


def stream(checks: Checks, outcomes: list[StreamOutcome], **kw) -> SseStream:
    def closing(outcome: StreamOutcome) -> bytes:
        outcomes.append(outcome)
        return CLOSE
    opts = dict(hold_back=False, early_stop=False, threshold=0.5, max_hold_chars=600, max_answer_chars=1 << 20)
    return SseStream(checks, closing, **{**opts, **kw})


async def run(s: SseStream, chunks: list[bytes], eos_last: bool = True) -> list[list[bytes | None]]:
    return [await s.feed(c, eos_last and i == len(chunks) - 1) for i, c in enumerate(chunks)]


def forwarded(chunks: list[bytes], replies: list[list[bytes | None]]) -> bytes:
    """What the client receives: each chunk as answered (None = unchanged), in order."""
    flat = [r for rs in replies for r in rs]
    assert len(flat) == len(chunks), "one reply per chunk"
    return b"".join(c if r is None else r for c, r in zip(chunks, flat))


async def test_without_hold_back_every_chunk_goes_at_once_and_the_verdict_precedes_done() -> None:
    checks, outcomes = Checks(), []
    chunks = completion_sse_chunks(ANSWER, "m", words_per_chunk=2)
    replies = await run(stream(checks, outcomes), chunks)
    assert all(len(r) == 1 for r in replies)  # nothing waited
    assert all(r == [None] for r in replies[:-1])  # byte-identical
    body = b"".join(chunks)
    done = body.index(b"data: [DONE]")
    assert forwarded(chunks, replies) == body[:done] + CLOSE + body[done:]
    assert len(checks.seen) == 4 and len(set(checks.seen)) == 4  # each sentence checked once
    (outcome,) = outcomes
    assert outcome.results[0].score == pytest.approx(0.9) and not outcome.cut and not outcome.stopped
    (span,) = outcome.results[0].spans
    assert ANSWER[span.start:span.end] == "Oslo built a copy in 1990."  # spans in answer offsets


async def test_a_chunk_ending_inside_an_event_waits_until_the_event_is_complete() -> None:
    chunks = completion_sse_chunks(ANSWER, "m", words_per_chunk=4)
    event = chunks[1]
    pieces = [chunks[0] + event[:10], event[10:20], event[20:] + chunks[2]] + chunks[3:]
    s = stream(Checks(), [])
    assert await s.feed(pieces[0], False) == []  # Envoy keeps holding it: its last event is not complete
    assert await s.feed(pieces[1], False) == []  # still inside the same event
    assert await s.feed(pieces[2], False) == [None, None, None]  # the event is complete: all three, in order
    assert await s.feed(pieces[3], False) == [None]  # and from then on one by one


async def test_done_split_across_chunks_still_gets_the_verdict_in_front() -> None:
    chunks = completion_sse_chunks("It is tall.", "m")
    body = b"".join(chunks)
    split = body.index(b"data: [DONE]") + 8  # "data: [D" | "ONE]\n\n"
    pieces = [body[:split], body[split:]]
    replies = await run(stream(Checks(), []), pieces)
    assert replies[0] == []
    done = body.index(b"data: [DONE]")
    assert forwarded(pieces, replies) == body[:done] + CLOSE + body[done:]


async def test_hold_back_releases_a_chunk_once_its_sentences_are_checked() -> None:
    checks, outcomes = Checks(), []
    chunks = completion_sse_chunks("The tower is tall. It is made of iron.", "m", words_per_chunk=1)
    s = stream(checks, outcomes, hold_back=True)
    replies = [await s.feed(c, False) for c in chunks]
    # the words of "The tower is tall." are held until "It" starts the next sentence and the first is checked
    it = next(i for i, c in enumerate(chunks) if b'"It"' in c or b'" It"' in c)
    assert replies[0] == [None]  # the role chunk carries no text
    assert all(r == [] for r in replies[1:it])
    assert replies[it] == [None] * (it - 1)  # every held chunk up to "tall.", in order; " It" itself waits
    assert checks.seen[0] == "The tower is tall."
    body = b"".join(chunks)
    done = body.index(b"data: [DONE]")
    assert forwarded(chunks, replies) == body[:done] + CLOSE + body[done:]  # nothing flagged: byte-identical


async def test_hold_back_with_block_stops_before_the_flagged_sentence() -> None:
    checks, outcomes = Checks(), []
    chunks = completion_sse_chunks(ANSWER, "m", words_per_chunk=1)
    s = stream(checks, outcomes, hold_back=True, early_stop=True)
    replies = [await s.feed(c, False) for c in chunks]
    out = forwarded(chunks, replies)
    text = out.decode()
    assert "Oslo" not in text and "1990" not in text  # the flagged sentence never reaches the client
    assert "1889" in text  # the checked sentences before it did
    assert out.endswith(CLOSE) and outcomes[-1].stopped
    assert b"iron" not in out  # everything after the stop is dropped
    assert replies[-1] == [b""]


async def test_a_stream_cut_upstream_is_closed_and_marked() -> None:
    outcomes: list[StreamOutcome] = []
    chunks = completion_sse_chunks(ANSWER, "m", words_per_chunk=3)[:5]  # no finish reason, no [DONE]
    body = b"".join(chunks)
    replies = await run(stream(Checks(), outcomes), chunks)
    assert forwarded(chunks, replies) == body + CLOSE
    assert outcomes[0].cut


async def test_an_unterminated_last_event_stays_behind_the_closing_events() -> None:
    chunks = completion_sse_chunks(ANSWER, "m", words_per_chunk=3)[:4]
    partial = chunks[-1][:-10]  # the upstream died inside an event
    pieces = chunks[:-1] + [partial]
    replies = await run(stream(Checks(), []), pieces)
    out = forwarded(pieces, replies)
    assert out == b"".join(chunks[:-1]) + CLOSE + partial  # clients discard an unterminated event at the end


async def test_a_failing_check_is_reported_and_nothing_is_held() -> None:
    outcomes: list[StreamOutcome] = []
    chunks = completion_sse_chunks(ANSWER, "m", words_per_chunk=2)
    replies = await run(stream(Checks(fail=Overloaded("busy")), outcomes, hold_back=True), chunks)
    assert isinstance(outcomes[0].error, Overloaded)
    body = b"".join(chunks)
    done = body.index(b"data: [DONE]")
    assert forwarded(chunks, replies) == body[:done] + CLOSE + body[done:]


async def test_an_answer_over_the_cap_stops_being_checked_or_kept() -> None:
    outcomes: list[StreamOutcome] = []
    chunks = completion_sse_chunks(ANSWER, "m", words_per_chunk=2)
    s = stream(Checks(), outcomes, hold_back=True, max_answer_chars=30)
    replies = await run(s, chunks)
    assert outcomes[0].too_large and not outcomes[0].results
    assert len(forwarded(chunks, replies)) == len(b"".join(chunks)) + len(CLOSE)
    assert not s.assembler.text(0)  # the text past the cap was not kept


async def test_abandon_counts_the_chunks_still_owed_a_reply() -> None:
    gate = asyncio.Event()
    s = stream(Checks(gate=gate), [], hold_back=True)
    chunks = completion_sse_chunks(ANSWER, "m", words_per_chunk=1)
    assert await s.feed(chunks[0], False) == [None]  # the role chunk carries no text
    assert await s.feed(chunks[1], False) == []  # "The": an open sentence, held
    assert await s.feed(chunks[2], False) == []
    assert s.abandon() == 2
    assert await s.feed(chunks[3], False) == [None]  # from now on everything passes unchanged


async def test_a_huge_stream_is_held_in_bounded_memory() -> None:
    """#19 item 3: a 30 MB streamed answer took the sidecar from 199 MB to a 4.4 GB peak. Past max_answer_chars
    the stream keeps nothing (text, events, checks): what it holds is bounded by the cap, not the stream."""
    import json
    import tracemalloc

    cap = 256 * 1024
    checks, outcomes = Checks(), []
    s = stream(checks, outcomes, hold_back=True, max_answer_chars=cap)
    words = "The tower is 330 metres tall and it opened in 1889. " * 20  # ~1 KB of text per event

    def chunk(i: int) -> bytes:
        delta = {"id": "c", "object": "chat.completion.chunk", "model": "m",
                 "choices": [{"index": 0, "delta": {"content": words}, "finish_reason": None}]}
        return b"data: " + json.dumps(delta).encode() + b"\n\n"

    total = 0
    tracemalloc.start()
    try:
        for i in range(30 * 1024):  # ~30 MB of events, fed and answered one chunk at a time
            data = chunk(i)
            total += len(data)
            replies = await s.feed(data, False)
            assert all(r is None for r in replies)  # passed through unchanged
            if i == 1000:  # ~1 MB in, 4x past the cap: from here on nothing may grow
                at_cap, _ = tracemalloc.get_traced_memory()
                tracemalloc.reset_peak()
        end = await s.feed(b"data: [DONE]\n\n", True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total > 30 * 1024 * 1024
    assert outcomes[0].too_large and end[-1] is not None and end[-1].startswith(CLOSE)
    assert peak - at_cap < 256 * 1024, f"{peak - at_cap} bytes more traced while 29 MB streamed past the cap"
    assert at_cap < 64 * cap  # what the first cap's worth of sentences left (their checks' results)
    assert len(s.assembler.text(0) or "") == 0 and not s._pending and not s._events


async def test_a_rewritten_event_split_across_chunks_goes_whole_with_the_chunk_where_it_ends() -> None:
    from extproc.protocol.logprobs import strip_event_logprobs

    ev = (b'data: {"choices":[{"index":0,"delta":{"content":"It is tall."},'
          b'"logprobs":{"content":[]},"finish_reason":null}]}\n\n')
    done = b"data: [DONE]\n\n"
    s = SseStream(Checks(), lambda o: CLOSE, hold_back=False, early_stop=False, threshold=0.5, max_hold_chars=600,
                  max_answer_chars=1 << 20, rewrite=strip_event_logprobs)
    pieces = [ev[:20], ev[20:50], ev[50:] + done]
    replies = await run(s, pieces)
    assert replies[0] == [] and replies[1] == []  # the event is not complete: nothing is answered yet
    out = replies[2]
    assert out[:2] == [b"", b""]  # its first parts go with the chunk where it ends, all three answered together
    assert out[2] == strip_event_logprobs(ev) + CLOSE + done
