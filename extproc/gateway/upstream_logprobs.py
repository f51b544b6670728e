"""One exchange's upstream logprobs: asked for when the decision wants them, read, and cut out again,
and stacked into each choice's score where `truthlens.signals.upstream_fusion` has a fit for the writer.

Owned by a ChatExchange when its decision has `upstream_logprobs`; the wire work is in
extproc.protocol.logprobs, the signals in extproc.inference.upstream.
"""

from __future__ import annotations

from typing import Callable

from extproc.inference.api import DetectionResult
from extproc.inference.upstream import UpstreamSignals, WriterFusion, upstream_signals
from extproc.protocol.logprobs import (
    TokenLogprob,
    ask_for_logprobs,
    choice_logprobs,
    strip_choice_logprobs,
    strip_event_logprobs,
)
from extproc.protocol.openai import read_json


class UpstreamLogprobs:
    __slots__ = ("asked", "tokens", "model")

    def __init__(self) -> None:
        self.asked = False  # we asked the upstream: the client must not see them
        self.tokens: dict[int, list[TokenLogprob]] = {}  # per choice index, in answer order
        self.model: str | None = None  # the response's `model`: whose logprobs these are

    def request(self, body: bytes, top_logprobs: int) -> bytes | None:
        """The upstream request asking for logprobs, or None when the client asked itself (then they stay)."""
        asked = ask_for_logprobs(body, top_logprobs)
        self.asked = asked is not None
        return asked

    def read(self, raw: bytes) -> None:
        """A chat.completion body or one chunk's JSON."""
        try:
            obj = read_json(raw)
        except (ValueError, RecursionError):
            return
        if self.model is None and isinstance(obj, dict) and isinstance(obj.get("model"), str):
            self.model = obj["model"]
        for i, tokens in choice_logprobs(obj).items():
            self.tokens.setdefault(i, []).extend(tokens)

    def read_event(self, data: str) -> None:
        """SseStream's on_event."""
        if '"logprobs"' in data:
            self.read(data.encode())

    def strip(self, body: bytes) -> bytes:
        """The JSON body the client gets: without the logprobs we asked for."""
        return strip_choice_logprobs(body) if self.asked else body

    def event_rewrite(self) -> Callable[[bytes], bytes] | None:
        """SseStream's rewrite: each event without the logprobs we asked for (None: the client asked, they stay)."""
        return strip_event_logprobs if self.asked else None

    def fused(self, fusion: WriterFusion | None, results: dict[int, DetectionResult]) -> dict[int, DetectionResult]:
        """Each choice's result stacked with its own logprob signals, where `fusion` has a fit for this writer."""
        if fusion is None:
            return results
        return {i: fusion.fuse(self.model, r, self.signals(i)) for i, r in results.items()}

    def signals(self, choice: int) -> UpstreamSignals | None:
        tokens = self.tokens.get(choice)
        return upstream_signals([(t.logprob, t.top) for t in tokens]) if tokens else None
