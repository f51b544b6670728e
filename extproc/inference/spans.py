"""Token probabilities -> character spans of the answer, and the response score."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

SCORE_METHODS = ("fused", "noisy_or", "max_span")


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


def _word_char(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def snap_to_words(text: str, start: int, end: int) -> tuple[int, int]:
    """Whole words, no surrounding whitespace: a span that starts or ends inside a word
    (WordPiece "##" pieces, BPE fragments) grows to the word's edges, and byte-level BPE's
    leading space is dropped, so spans and the warning quote whole words."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    if start >= end:
        return start, end
    while start > 0 and _word_char(text[start - 1]) and _word_char(text[start]):
        start -= 1
    while end < len(text) and _word_char(text[end - 1]) and _word_char(text[end]):
        end += 1
    return start, end


def filter_spans(text: str, raw: Sequence[RawSpan], f: SpanFilter) -> list[RawSpan]:
    """Snap to whole words (spans that then overlap merge), then apply min_span_tokens /
    min_span_chars / min_span_confidence."""
    snapped: list[RawSpan] = []
    for sp in raw:
        start, end = snap_to_words(text, sp.start, sp.end)
        if snapped and start < snapped[-1].end:
            last = snapped.pop()
            sp = RawSpan(last.start, max(last.end, end), last.probs + sp.probs)
            start, end = sp.start, sp.end
        snapped.append(RawSpan(start, end, sp.probs))
    return [
        sp for sp in snapped
        if len(sp.probs) >= f.min_span_tokens and sp.end - sp.start >= f.min_span_chars
        and sp.score >= f.min_span_confidence
    ]


def response_score(raw: Sequence[RawSpan], method: str) -> float:
    """noisy_or: 1 - prod(1 - p) over the flagged tokens of kept spans; max_span: best span score.
    ("fused" is scored per sentence: `sentence_doubt`.)"""
    if method not in SCORE_METHODS:
        raise ValueError(f"truthlens.score_method: {method!r} is not one of {list(SCORE_METHODS)}")
    if not raw:
        return 0.0
    if method in ("max_span", "fused"):
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


def answer_sentences(text: str) -> list[tuple[int, int]]:
    """Sentence ranges that hold something to judge (blank pieces dropped)."""
    return [(s, e) for s, e in sentence_bounds(text) if text[s:e].strip()]


def sentence_doubt(
    offsets: Sequence[tuple[int, int]], probs: Sequence[float], sentences: Sequence[tuple[int, int]],
    entailment: Sequence[float],
) -> list[float]:
    """Per sentence: sqrt(max detector token probability inside it x (1 - verifier P(entailment))).

    The geometric mean flags a sentence only when both models doubt it: the token detector
    alone flags faithful rewordings, the verifier alone flags every sentence a context window
    does not state word for word. The response's raw "fused" score is the worst sentence.
    (Zeroing the sentences the verifier labels entailment lost 0.07 AUROC on the real-output
    suite's RAG dev sets; the engine relabels instead, see `OnnxEngine._detect_fused`.)
    """
    out = []
    for (s, e), ent in zip(sentences, entailment):
        inside = max((float(p) for (a, b), p in zip(offsets, probs) if b > a and a < e and b > s), default=0.0)
        out.append(math.sqrt(max(inside, 0.0) * max(1.0 - float(ent), 0.0)))
    return out
