"""Incremental Server-Sent Events for streamed chat completions.

Public API:

- ``SSEParser().feed(chunk: bytes) -> list[SSEEvent]``: WHATWG event-stream parsing over
  arbitrary byte chunks (events split across chunks or several per chunk; LF, CRLF and CR line
  ends, a CRLF split between chunks; multi-line ``data:``; ``:`` comments; ``event:``/``id:``/
  ``retry:`` fields; a leading BOM; multibyte UTF-8 split between chunks). ``SSEEvent.start`` /
  ``.end`` are absolute byte offsets of the event's block in the stream.
- ``ChatStreamAssembler().add(event)``: accumulates ``choices[i].delta.content`` per choice
  index from ``chat.completion.chunk`` data, notes ``[DONE]``, counts what it had to ignore.
- ``ChatStreamRelay().feed(chunk) -> bytes`` / ``.finish(insert) -> bytes``: what to forward
  for each STREAMED body chunk. Complete blocks go on at once (byte-identical); only an
  incomplete trailing block and the ``[DONE]`` block are held, so the verdict (and a warning
  delta) can be inserted before ``[DONE]`` at the end of the stream.
- ``format_event(data, event=None) -> bytes``, ``verdict_chunk(verdict, ...) -> bytes``,
  ``content_delta_chunk(index, text, ...) -> bytes``.

The verdict travels as a ``chat.completion.chunk`` with ``"choices": []`` and a
``"truthlens"`` extension object and no ``event:`` name, because the official OpenAI SDKs
parse unnamed events as chunks, ignore empty ``choices``, and keep unknown fields.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from extproc.protocol.openai import dump_json, read_json, scrub_surrogates

__all__ = [
    "ChatStreamAssembler",
    "ChatStreamRelay",
    "SSEEvent",
    "SSEParser",
    "DONE_EVENT",
    "content_delta_chunk",
    "finish_chunk",
    "format_event",
    "verdict_chunk",
]

_BOM = b"\xef\xbb\xbf"
_LINE_BREAKS = re.compile(r"\r\n|\r|\n")
DONE = "[DONE]"
DONE_EVENT = b"data: [DONE]\n\n"  # what a stream ends with (the OpenAI wire form)


@dataclass(frozen=True, slots=True)
class SSEEvent:
    data: str
    event: str | None = None  # None = no `event:` field (WHATWG type "message")
    id: str | None = None  # the stream's last event id when this event was dispatched
    start: int = 0  # absolute byte offset where this event's block began
    end: int = 0  # absolute byte offset just past the blank line that dispatched it


class SSEParser:
    """WHATWG event-stream parser that keeps state across chunks; one per response."""

    __slots__ = ("_tail", "_skip_lf", "_first", "_data", "_event", "_last_id", "_pos", "_block_start", "retry")

    def __init__(self) -> None:
        self._tail = bytearray()  # bytes of an unterminated line
        self._skip_lf = False  # the previous chunk ended in CR; a leading LF belongs to it
        self._first = True
        self._data: list[str] = []
        self._event: str | None = None
        self._last_id: str | None = None
        self._pos = 0  # absolute offset of the first byte of self._tail
        self._block_start = 0
        self.retry: int | None = None  # last valid `retry:` value (ms)

    @property
    def boundary(self) -> int:
        """Absolute offset just past the last blank line: everything before it is complete blocks."""
        return self._block_start

    @property
    def incomplete(self) -> bool:
        """True when bytes after the last blank line would be lost at end of stream (spec: discarded)."""
        return bool(self._data or self._tail or self._event is not None)

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Events completed by `chunk`. A blank line ended by a CR as the chunk's last byte waits for the
        next chunk (an LF there belongs to it, and the event's `end` with it); an empty chunk, which Envoy
        sends at the end of a stream, settles it as a lone CR."""
        events: list[SSEEvent] = []
        if not chunk:
            if self._tail == b"\r":
                self._tail = bytearray()
                self._pos += 1
                event = self._line(b"", self._pos)
                if event is not None:
                    events.append(event)
                self._skip_lf = True
            return events
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                if self._block_start == self._pos:  # the CR ended a block: the LF joins it
                    self._block_start += 1
                self._pos += 1
                chunk = chunk[1:]
        if self._tail and self._tail != b"\r" and b"\n" not in chunk and b"\r" not in chunk:
            self._tail += chunk  # a long line arriving in pieces: append, do not rescan
            return events
        data = bytes(self._tail) + chunk if self._tail else chunk
        lines = data.splitlines(keepends=True)
        if lines and (lines[-1][-1:] not in (b"\n", b"\r") or lines[-1] == b"\r"):
            # an unterminated line, or a blank line whose CR may be the first half of a CRLF
            self._tail = bytearray(lines.pop())
        else:
            self._tail = bytearray()
        pos = self._pos
        for raw in lines:
            pos += len(raw)
            cut = 2 if raw.endswith(b"\r\n") else 1
            event = self._line(raw[:-cut], pos)
            if event is not None:
                events.append(event)
        if lines and lines[-1].endswith(b"\r") and not self._tail:
            self._skip_lf = True
        self._pos = pos
        return events

    def _line(self, line: bytes, end: int) -> SSEEvent | None:
        if self._first:
            self._first = False
            if line.startswith(_BOM):
                line = line[3:]
        if not line:
            return self._dispatch(end)
        if line[:1] == b":":
            return None
        field, sep, value = line.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if field == b"data":
            self._data.append(value.decode("utf-8", "replace"))
        elif field == b"event":
            self._event = value.decode("utf-8", "replace")
        elif field == b"id":
            if b"\x00" not in value:
                self._last_id = value.decode("utf-8", "replace")
        elif field == b"retry":
            if value.isdigit():
                self.retry = int(value)
        return None

    def _dispatch(self, end: int) -> SSEEvent | None:
        start, self._block_start = self._block_start, end
        if not self._data:
            self._event = None
            return None
        event = SSEEvent("\n".join(self._data), self._event, self._last_id, start, end)
        self._data = []
        self._event = None
        return event


class ChatStreamAssembler:
    """The answer so far, per choice, from chat.completion.chunk events."""

    __slots__ = ("_parts", "_lengths", "_dropped", "id", "model", "created", "done", "chunks", "ignored", "error",
                 "finish_reasons", "chars")

    def __init__(self) -> None:
        self._parts: dict[int, list[str]] = {}
        self._lengths: dict[int, int] = {}  # characters per choice (kept after drop_text)
        self._dropped = False
        self.id: str | None = None
        self.model: str | None = None
        self.created: int | None = None
        self.done = False  # saw `data: [DONE]`
        self.chunks = 0  # JSON chunks accepted
        self.ignored = 0  # events that were not chunk JSON, or came after [DONE]
        self.error: Any = None  # an in-stream `{"error": ...}` payload, if any
        self.finish_reasons: dict[int, str] = {}
        self.chars = 0  # total answer characters so far (for size caps)

    def add(self, event: SSEEvent) -> None:
        self.add_data(event.data)

    def add_data(self, data: str) -> None:
        if self.done:
            self.ignored += 1
            return
        if data.strip() == DONE:
            self.done = True
            return
        try:
            obj = read_json(data)  # read only, never re-serialized
        except (json.JSONDecodeError, RecursionError):
            self.ignored += 1
            return
        if not isinstance(obj, dict):
            self.ignored += 1
            return
        if "error" in obj and "choices" not in obj:
            self.error = obj["error"]
            return
        choices = obj.get("choices")
        if not isinstance(choices, list):
            self.ignored += 1
            return
        self.chunks += 1
        self._meta(obj)
        for pos, choice in enumerate(choices):
            if isinstance(choice, dict):
                self._choice(choice, pos)

    def _meta(self, obj: dict[str, Any]) -> None:
        if self.id is None and isinstance(obj.get("id"), str):
            self.id = scrub_surrogates(obj["id"])
        if self.model is None and isinstance(obj.get("model"), str):
            self.model = scrub_surrogates(obj["model"])
        created = obj.get("created")
        if self.created is None and isinstance(created, int) and not isinstance(created, bool):
            self.created = created

    def _choice(self, choice: dict[str, Any], pos: int) -> None:
        index = choice.get("index", pos)
        if not isinstance(index, int) or isinstance(index, bool):
            self.ignored += 1
            return
        parts = self._parts.setdefault(index, [])
        delta = choice.get("delta")
        if isinstance(delta, dict):
            content = delta.get("content")
            if isinstance(content, str) and content:
                if not self._dropped:
                    parts.append(content)
                self._lengths[index] = self._lengths.get(index, 0) + len(content)
                self.chars += len(content)
        reason = choice.get("finish_reason")
        if isinstance(reason, str):
            self.finish_reasons[index] = reason

    def text_length(self, index: int) -> int:
        """Characters choice `index` has received so far (without joining its text)."""
        return self._lengths.get(index, 0)

    def drop_text(self) -> None:
        """Stop keeping the answer text (a size cap was reached); lengths, metadata and [DONE] still count."""
        self._dropped = True
        for parts in self._parts.values():
            parts.clear()

    def indices(self) -> tuple[int, ...]:
        return tuple(sorted(self._parts))

    def text(self, index: int) -> str | None:
        """The choice's answer so far; an escaped lone surrogate in a delta reads as U+FFFD."""
        parts = self._parts.get(index)
        return scrub_surrogates("".join(parts)) if parts else None

    def answers(self) -> tuple[str | None, ...]:
        """One entry per choice index seen, ascending; None = no content (tool calls only)."""
        return tuple(self.text(i) for i in sorted(self._parts))


class ChatStreamRelay:
    """Decides, chunk by chunk, what a streamed response forwards now and what it holds.

    Complete SSE blocks are forwarded unchanged as soon as their blank line arrives. Held: an
    incomplete trailing block (its rest is still on the way) and everything from the
    ``[DONE]`` block on, so ``finish(insert)`` can put the verdict before ``[DONE]``. A single
    unterminated block larger than ``max_held`` bytes is forwarded rather than buffered.
    """

    __slots__ = ("parser", "assembler", "_unsent", "_sent", "_done_at", "_max_held", "_finished")

    def __init__(self, max_held: int = 1 << 20) -> None:
        self.parser = SSEParser()
        self.assembler = ChatStreamAssembler()
        self._unsent = bytearray()  # bytes from absolute offset self._sent on
        self._sent = 0
        self._done_at: int | None = None
        self._max_held = max_held
        self._finished = False

    @property
    def done(self) -> bool:
        """The `[DONE]` event has arrived (the verdict can be computed now)."""
        return self._done_at is not None

    @property
    def finished(self) -> bool:
        """`finish()` was called: later chunks pass straight through, and a second finish adds nothing."""
        return self._finished

    def feed(self, chunk: bytes) -> bytes:
        if self._finished:  # the verdict is out; whatever follows goes on untouched
            self.assembler.ignored += len(self.parser.feed(chunk))
            self._sent += len(chunk)
            return chunk
        self._unsent += chunk
        for event in self.parser.feed(chunk):
            self.assembler.add(event)
            if self._done_at is None and self.assembler.done and event.data.strip() == DONE:
                self._done_at = max(event.start, self._sent)
        if self._done_at is not None:
            limit = self._done_at
        elif len(self._unsent) > self._max_held:
            limit = self._sent + len(self._unsent)
        else:
            limit = self.parser.boundary
        n = limit - self._sent
        if n <= 0:
            return b""
        out = bytes(self._unsent[:n])
        del self._unsent[:n]
        self._sent = limit
        return out

    def finish(self, insert: bytes = b"") -> bytes:
        """Everything still held, with `insert` placed before [DONE] (or before an unterminated tail).

        Call it once: at `done`, or at end of stream when [DONE] never came. A second call
        returns what is still held and ignores `insert`, so a stream never carries two verdicts.
        """
        if self._finished:
            insert = b""
        self._finished = True
        out = bytes(insert) + bytes(self._unsent)
        self._sent += len(self._unsent)
        self._unsent.clear()
        return out


def format_event(data: str, event: str | None = None) -> bytes:
    """One SSE block; multi-line data becomes several `data:` lines."""
    head = ""
    if event is not None:
        if _LINE_BREAKS.search(event):
            raise ValueError("SSE event name must not contain line breaks")
        head = f"event: {event}\n"
    body = "".join(f"data: {line}\n" for line in _LINE_BREAKS.split(data))
    return f"{head}{body}\n".encode("utf-8")


def _chunk(choices: list[Any], id: str | None, model: str | None, created: int | None) -> dict[str, Any]:
    return {
        "id": id or "truthlens",
        "object": "chat.completion.chunk",
        "created": created if created is not None else int(time.time()),
        "model": model or "",
        "choices": choices,
    }


def verdict_chunk(
    verdict: Mapping[str, Any],
    *,
    id: str | None = None,  # noqa: A002 - mirrors the chunk field
    model: str | None = None,
    created: int | None = None,
) -> bytes:
    """The final SSE event (send before [DONE]): a chunk with no choices and a `truthlens` object."""
    obj = _chunk([], id, model, created)
    obj["truthlens"] = dict(verdict)
    return format_event(dump_json(obj).decode("utf-8"))


def content_delta_chunk(
    index: int,
    text: str,
    *,
    id: str | None = None,  # noqa: A002
    model: str | None = None,
    created: int | None = None,
) -> bytes:
    """An SSE event that appends `text` to choice `index` (a warning at the end of a stream)."""
    choice = {"index": index, "delta": {"content": text}, "finish_reason": None}
    return format_event(dump_json(_chunk([choice], id, model, created)).decode("utf-8"))


def finish_chunk(
    index: int,
    reason: str,
    *,
    id: str | None = None,  # noqa: A002
    model: str | None = None,
    created: int | None = None,
) -> bytes:
    """An SSE event that ends choice `index` with `finish_reason` (an early stop: "content_filter")."""
    choice = {"index": index, "delta": {}, "finish_reason": reason}
    return format_event(dump_json(_chunk([choice], id, model, created)).decode("utf-8"))
