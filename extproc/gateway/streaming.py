"""Streamed (SSE) answers: judged sentence by sentence while they arrive, with Envoy holding the bytes.

Envoy's STREAMED body mode sends each chunk as it arrives and keeps it queued until the sidecar
answers that chunk (answers go in order). A reply may wait; while it does, the bytes are still
Envoy's, so a sidecar that dies, or stalls past `message_timeout`, loses nothing: fail-open
re-injects the queued chunks byte-identical. The sidecar therefore never keeps a byte itself. A
reply passes its chunk unchanged, or carries all of that chunk's bytes plus events inserted at an
event boundary (the verdict in front of `[DONE]`), or, for an early stop, the chunk cut at an event
boundary plus the closing events (then later chunks are dropped).

A reply waits only
- while its chunk ends inside an event, until a later chunk completes that event (no client could
  read those bytes earlier, and the verdict may have to go in front of that event if it is [DONE]);
- with `hold_back: sentence`, until every sentence the chunk carries has been checked.

Each sentence is checked once, as soon as the next one starts (or the stream ends, or it grows past
`max_hold_chars`): the work per chunk is bounded and nothing is re-scored as tokens arrive.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Awaitable, Callable

from extproc.inference.api import DetectionResult
from extproc.inference.spans import answer_sentences
from extproc.protocol.sse import DONE, ChatStreamAssembler, SSEParser

Check = Callable[[str], Awaitable[DetectionResult]]
Rewrite = Callable[[bytes], bytes]  # an event block -> what to send instead (the same bytes: unchanged)
_SPACE = re.compile(r"\s*")


@dataclass(slots=True)
class StreamOutcome:
    """What the closing events describe: the per-choice results, or why there are none."""

    results: dict[int, DetectionResult]  # by choice index, sentences merged
    error: BaseException | None = None  # a sentence check failed (timeout, overloaded, ...)
    too_large: bool = False  # the answer outgrew the size cap: checks stopped
    cut: bool = False  # the stream ended with neither [DONE] nor a finish reason
    stopped: bool = False  # early stop: a flagged sentence ended the stream (the caller adds [DONE])
    waited_ms: float = 0.0  # time replies waited on checks: what the stream added


Closing = Callable[[StreamOutcome], bytes]


@dataclass(slots=True)
class _Chunk:
    data: bytes
    start: int  # absolute stream offset of data[0]
    text_end: dict[int, int]  # per choice: answer characters complete once this chunk's events are read
    edits: list[tuple[int, int, bytes]] = field(default_factory=list)  # (from, to, new bytes) inside data
    # a rewritten event starts in this chunk and ends in the next: its new bytes go with the next chunk's
    # reply, so the two replies must go together (back to back: nothing waits in between)
    joins_next: bool = False

    @property
    def end(self) -> int:
        return self.start + len(self.data)

    def between(self, a: int, b: int) -> bytes:
        """data[a:b] with the edits inside it applied (edits never straddle a or b: both are event bounds)."""
        out, pos = bytearray(), a
        for lo, hi, new in self.edits:
            if a <= lo and hi <= b:
                out += self.data[pos:lo] + new
                pos = hi
        return bytes(out + self.data[pos:b])

    def reply(self) -> bytes | None:
        """What answers this chunk when nothing is inserted: None (unchanged) unless events were rewritten."""
        return self.between(0, len(self.data)) if self.edits else None


@dataclass(slots=True)
class _Event:
    start: int  # absolute byte offsets of the event's block
    end: int
    text: dict[int, tuple[int, int]]  # choice -> answer characters [from, to) it added


@dataclass(slots=True)
class _Choice:
    """One choice's sentence checks."""

    scheduled: int = 0  # answer characters handed to checks so far
    checks: list[tuple[int, asyncio.Future[DetectionResult]]] = field(default_factory=list)  # (offset, check)
    confirmed: int = 0  # answer characters whose checks are done (and the whitespace after them)


class SseStream:
    """One streamed answer: `feed` each STREAMED chunk, get back the replies that can go now.

    A reply is None (the chunk unchanged) or the bytes that replace the chunk. `closing` builds the
    events that close the stream from the outcome (verdict event, warning deltas, and for an early
    stop the finish and `[DONE]` events): the caller owns verdicts and actions.
    """

    def __init__(self, check: Check, closing: Closing, *, hold_back: bool, early_stop: bool, threshold: float,
                 max_hold_chars: int, max_answer_chars: int, on_event: Callable[[str], None] | None = None,
                 rewrite: Rewrite | None = None) -> None:
        self._check, self._closing = check, closing
        # on_event: each complete event's data (the caller reads what it needs, e.g. logprobs); rewrite: each
        # complete event block (an event split across chunks is rewritten whole into the reply of the chunk
        # where it ends, and the chunks it spans are answered together)
        self._on_event, self._rewrite = on_event, rewrite
        self.hold_back, self.early_stop, self.threshold = hold_back, early_stop, threshold
        self.max_hold_chars, self.max_answer_chars = max_hold_chars, max_answer_chars
        self.parser = SSEParser()
        self.assembler = ChatStreamAssembler()
        self._pending: deque[_Chunk] = deque()  # chunks not answered yet, oldest first
        self._events: deque[_Event] = deque()  # complete events not yet answered (early stop cuts at one)
        self._choices: dict[int, _Choice] = {}
        self._received = 0  # stream bytes seen
        self._done_at: int | None = None  # where the [DONE] block starts
        self._closed = False  # the closing events went out: later chunks pass unchanged
        self._stopped = False  # early stop: later chunks are dropped
        self._too_large = False
        self._waited_ms = 0.0
        self._owed = 0  # chunks received and not answered yet (what a failure must still answer)

    @property
    def closed(self) -> bool:
        return self._closed

    async def feed(self, data: bytes, end_of_stream: bool) -> list[bytes | None]:
        """Replies for every chunk that can be answered now, oldest first (one per chunk, in order)."""
        self._owed += 1
        out = await self._feed(data, end_of_stream)
        self._owed -= len(out)
        return out

    async def _feed(self, data: bytes, end_of_stream: bool) -> list[bytes | None]:
        if self._stopped:
            return [b""]
        if self._closed:
            return [None]
        self._read(data)
        finished = end_of_stream or self._done_at is not None
        self._schedule(finished)
        if finished:
            return await self._finish(end_of_stream)
        if self.hold_back:
            await self._settle()
            flagged = self._flagged() if self.early_stop else None
            if flagged is not None:
                return await self._stop(*flagged)
        return self._release()

    def abandon(self) -> int:
        """Give up judging (a bug of ours): how many chunks still wait for a reply; later chunks pass unchanged."""
        waiting, self._owed = self._owed, 0
        self._pending.clear()
        self._events.clear()
        self._closed = True
        self.cancel()
        return waiting

    def cancel(self) -> None:
        """The stream ended early: stop checks nobody will read."""
        for c in self._choices.values():
            for _, fut in c.checks:
                fut.cancel()

    # ---- reading -------------------------------------------------------------------------------

    def _read(self, data: bytes) -> None:
        start = self._received
        self._received += len(data)
        a = self.assembler
        chunk = _Chunk(data, start, {})
        for event in self.parser.feed(data):
            if self._on_event is not None:
                self._on_event(event.data)
            if self._rewrite is not None:
                self._rewrite_event(chunk, event.start, event.end)
            before = {i: a.text_length(i) for i in a.indices()}
            a.add(event)
            if self._done_at is None and a.done and event.data.strip() == DONE:
                self._done_at = event.start
            if self._too_large:
                continue
            added = {i: (before.get(i, 0), a.text_length(i)) for i in a.indices() if a.text_length(i) > before.get(i, 0)}
            if added:
                self._events.append(_Event(event.start, event.end, added))
        if not self._too_large and a.chars > self.max_answer_chars:
            self._too_large = True  # past the cap nothing more is checked or kept; the verdict says too_large
            self.cancel()
            for c in self._choices.values():
                c.checks.clear()
            a.drop_text()
            self._events.clear()
        chunk.text_end = {i: a.text_length(i) for i in a.indices()}
        self._pending.append(chunk)

    def _rewrite_event(self, chunk: _Chunk, lo: int, hi: int) -> None:
        """Record the rewrite of the event block [lo, hi) (absolute), which ends in `chunk`."""
        spanned = [c for c in self._pending if c.end > lo]  # earlier chunks holding its start (never answered:
        block = b"".join(c.data[max(lo - c.start, 0):] for c in spanned)  # their last event was incomplete)
        block += chunk.data[max(lo - chunk.start, 0):hi - chunk.start]
        new = self._rewrite(block)
        if new == block:
            return
        for c in spanned:
            c.edits.append((max(lo - c.start, 0), len(c.data), b""))
            c.joins_next = True
        chunk.edits.append((max(lo - chunk.start, 0), hi - chunk.start, new))

    def _schedule(self, finished: bool) -> None:
        """Start a check for every sentence that is complete now (each sentence once)."""
        if self._too_large:
            return
        a = self.assembler
        for i in a.indices():
            c = self._choices.setdefault(i, _Choice())
            if a.text_length(i) <= c.scheduled:
                continue
            text = a.text(i) or ""
            rest = text[c.scheduled:]
            bounds = answer_sentences(rest)
            if not finished and bounds:
                if len(rest) - bounds[-1][0] < self.max_hold_chars:  # the last sentence may still grow
                    bounds = bounds[:-1]
            for s, e in bounds:
                s += len(rest[s:e]) - len(rest[s:e].lstrip())  # a sentence starts at its first word
                c.checks.append((c.scheduled + s, asyncio.ensure_future(self._check(rest[s:e]))))
            if bounds:
                c.scheduled += bounds[-1][1]
            if finished:
                c.scheduled = len(text)

    async def _settle(self) -> None:
        """hold_back: wait for the checks started so far; move each choice's confirmed mark."""
        todo = [fut for c in self._choices.values() for _, fut in c.checks if not fut.done()]
        if todo:
            t0 = time.perf_counter()
            await asyncio.wait(todo)
            self._waited_ms += (time.perf_counter() - t0) * 1000.0
        if self._too_large:
            return
        for i, c in self._choices.items():
            text = self.assembler.text(i) or ""
            c.confirmed = _SPACE.match(text, c.scheduled).end()  # every check of this choice is done now

    # ---- answering -----------------------------------------------------------------------------

    def _releasable(self, chunk: _Chunk) -> bool:
        if chunk.end > self.parser.boundary:  # its last event is not complete yet (it may be [DONE])
            return False
        if not self.hold_back or self._too_large:
            return True
        return all(end <= self._choices[i].confirmed if i in self._choices else end == 0
                   for i, end in chunk.text_end.items())

    def _release(self) -> list[bytes | None]:
        n = 0
        for k, chunk in enumerate(self._pending):
            if not self._releasable(chunk):
                break
            if not chunk.joins_next:
                n = k + 1
        out: list[bytes | None] = []
        for _ in range(n):
            chunk = self._pending.popleft()
            out.append(chunk.reply())
            self._forget_events(chunk.end)
        return out

    def _forget_events(self, upto: int) -> None:
        while self._events and self._events[0].end <= upto:
            self._events.popleft()

    def _flagged(self) -> tuple[int, int] | None:
        """(choice, answer offset) of the first checked sentence at or above the threshold."""
        for i, c in self._choices.items():
            for offset, fut in c.checks:
                if fut.done() and not fut.cancelled() and fut.exception() is None \
                        and fut.result().score >= self.threshold:
                    return i, offset
        return None

    async def _stop(self, choice: int, offset: int) -> list[bytes | None]:
        """Early stop: answer the chunks before the flagged sentence, cut the one holding its start, close."""
        sent_upto = self._pending[0].start
        cut = self._received
        for event in self._events:
            span = event.text.get(choice)
            if span is not None and span[1] > offset:
                cut = event.start if event.start >= sent_upto else event.end  # never split an event sent already
                break
        closing = self._closing(self._outcome(stopped=True))
        self._stopped = self._closed = True
        self.cancel()
        out: list[bytes | None] = []
        while self._pending:
            chunk = self._pending.popleft()
            end = chunk.end
            if end <= cut:
                out.append(chunk.reply())
            elif chunk.start <= cut:
                out.append(chunk.between(0, cut - chunk.start) + closing)
                closing = b""
            else:
                out.append(b"")
        return out

    async def _finish(self, end_of_stream: bool) -> list[bytes | None]:
        """[DONE] (or the end of the stream) arrived: check what is left, insert the closing events."""
        await self._settle()
        flagged = self._flagged() if self.hold_back and self.early_stop else None
        if flagged is not None:
            return await self._stop(*flagged)
        cut = self._done_at is None and not self.assembler.finish_reasons
        closing = self._closing(self._outcome(cut=cut))
        self._closed = True
        if self._done_at is not None:
            at = self._done_at  # in front of the [DONE] block
        elif self.parser.incomplete:
            at = self.parser.boundary  # in front of an unterminated block, which clients discard at the end
        else:
            at = self._received
        out: list[bytes | None] = []
        while self._pending:
            chunk = self._pending.popleft()
            end = chunk.end
            if closing and chunk.start <= at <= end and (at < end or not self._pending):
                pos = at - chunk.start
                out.append(chunk.between(0, pos) + closing + chunk.between(pos, len(chunk.data)))
                closing = b""
            elif closing and not self._pending:  # the insertion point went out already: close at the end
                out.append(chunk.between(0, len(chunk.data)) + closing)
            else:
                out.append(chunk.reply())
        self._events.clear()
        return out

    def _outcome(self, *, stopped: bool = False, cut: bool = False) -> StreamOutcome:
        error: BaseException | None = None
        results: dict[int, DetectionResult] = {}
        if not self._too_large:
            for i, c in self._choices.items():
                parts: list[tuple[int, DetectionResult]] = []
                for offset, fut in c.checks:
                    if not fut.done() or fut.cancelled():
                        continue
                    exc = fut.exception()
                    if exc is not None:
                        error = error or exc
                    else:
                        parts.append((offset, fut.result()))
                if parts:
                    results[i] = merge_sentences(parts)
        return StreamOutcome(results, error, self._too_large, cut and not stopped, stopped, self._waited_ms)


def merge_sentences(parts: list[tuple[int, DetectionResult]]) -> DetectionResult:
    """Sentence results of one answer as one result: the worst sentence's score, every span in answer offsets."""
    spans = tuple(replace(s, start=s.start + off, end=s.end + off) for off, r in parts for s in r.spans)
    signals = tuple(dict.fromkeys(sig for _, r in parts for sig in r.signals))
    return DetectionResult(score=max(r.score for _, r in parts), spans=spans,
                           windows=max(r.windows for _, r in parts),
                           dropped_spans=sum(r.dropped_spans for _, r in parts),
                           latency_ms=sum(r.latency_ms for _, r in parts), signals=signals)
