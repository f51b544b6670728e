"""Token probabilities -> character spans of the answer, and the response score."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from extproc.inference.api import Span

SCORE_METHODS = ("noisy_or", "max_span")


@dataclass(frozen=True, slots=True)
class SpanFilter:
    token_threshold: float = 0.5
    min_span_tokens: int = 1
    min_span_chars: int = 2
    min_span_confidence: float = 0.5


@dataclass(frozen=True, slots=True)
class RawSpan:
    """A span before filtering, with the probabilities of its flagged tokens (for noisy-OR)."""

    start: int
    end: int
    probs: tuple[float, ...]

    @property
    def score(self) -> float:
        return max(self.probs)


def merge_tokens(
    text: str, offsets: Sequence[tuple[int, int]], probs: Sequence[float], threshold: float
) -> list[RawSpan]:
    """Flagged tokens (p >= threshold) merge into spans when only whitespace separates them.

    Zero-length offsets (special or empty tokens) are skipped: they neither
    flag nor break a span.
    """
    spans: list[RawSpan] = []
    cur_start = cur_end = -1
    cur_probs: list[float] = []
    for (s, e), p in zip(offsets, probs):
        if e <= s:
            continue
        if p < threshold:
            if cur_probs:
                spans.append(RawSpan(cur_start, cur_end, tuple(cur_probs)))
                cur_probs = []
            continue
        if cur_probs and (s <= cur_end or text[cur_end:s].isspace()):
            cur_end = max(cur_end, e)
            cur_probs.append(float(p))
        else:
            if cur_probs:
                spans.append(RawSpan(cur_start, cur_end, tuple(cur_probs)))
            cur_start, cur_end, cur_probs = s, e, [float(p)]
    if cur_probs:
        spans.append(RawSpan(cur_start, cur_end, tuple(cur_probs)))
    return spans


def _trimmed(text: str, start: int, end: int) -> tuple[int, int]:
    """Byte-level BPE offsets can include the leading space; spans should not."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def filter_spans(text: str, raw: Sequence[RawSpan], f: SpanFilter) -> list[RawSpan]:
    """Apply min_span_tokens / min_span_chars / min_span_confidence."""
    out = []
    for sp in raw:
        start, end = _trimmed(text, sp.start, sp.end)
        if len(sp.probs) < f.min_span_tokens or end - start < f.min_span_chars or sp.score < f.min_span_confidence:
            continue
        out.append(RawSpan(start, end, sp.probs))
    return out


def to_api_spans(text: str, raw: Sequence[RawSpan]) -> list[Span]:
    return [Span(start=s.start, end=s.end, text=text[s.start:s.end], score=s.score, tokens=len(s.probs)) for s in raw]


def response_score(raw: Sequence[RawSpan], method: str) -> float:
    """noisy_or: 1 - prod(1 - p) over the flagged tokens of kept spans; max_span: best span score."""
    if method not in SCORE_METHODS:
        raise ValueError(f"truthlens.score_method: {method!r} is not one of {list(SCORE_METHODS)}")
    if not raw:
        return 0.0
    if method == "max_span":
        return max(s.score for s in raw)
    keep = 1.0
    for s in raw:
        for p in s.probs:
            keep *= 1.0 - p
    return 1.0 - keep


_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+|\n+")


def sentence_bounds(text: str) -> list[tuple[int, int]]:
    """Sentence character ranges (split after . ! ? followed by space, and at newlines)."""
    bounds, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        if m.start() > start:
            bounds.append((start, m.start()))
        start = m.end()
    if start < len(text):
        bounds.append((start, len(text)))
    return bounds or [(0, len(text))]


def sentence_for(text: str, bounds: Sequence[tuple[int, int]], start: int, end: int) -> str:
    """The sentence(s) holding [start, end): the NLI hypothesis for that span."""
    covering = [(s, e) for s, e in bounds if s < end and e > start]
    if not covering:
        return text[start:end]
    return text[covering[0][0] : covering[-1][1]].strip()
