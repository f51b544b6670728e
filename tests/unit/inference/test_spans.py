import math

import pytest

from extproc.inference.spans import (
    RawSpan,
    SpanFilter,
    filter_spans,
    merge_tokens,
    response_score,
    sentence_bounds,
    sentence_for,
    snap_to_words,
)

TEXT = "Paris is big. Lyon has 9 million people."
# word-level offsets for TEXT
OFFS = [(0, 5), (6, 8), (9, 12), (12, 13), (14, 18), (19, 22), (23, 24), (25, 32), (33, 39), (39, 40)]


def test_tokens_separated_only_by_whitespace_join_into_one_span():
    probs = [0.1, 0.1, 0.1, 0.1, 0.9, 0.8, 0.7, 0.2, 0.1, 0.1]
    spans = merge_tokens(TEXT, OFFS, probs, 0.5)
    assert [(s.start, s.end) for s in spans] == [(14, 24)]
    assert TEXT[14:24] == "Lyon has 9"
    assert spans[0].score == pytest.approx(0.9)
    assert spans[0].probs == pytest.approx((0.9, 0.8, 0.7))


def test_unflagged_token_splits_spans_and_adjacent_subwords_join():
    offs = [(0, 3), (3, 5), (6, 8), (9, 12)]  # "Paris" as two subwords, then "is", "big"
    spans = merge_tokens(TEXT, offs, [0.9, 0.6, 0.1, 0.7], 0.5)
    assert [(s.start, s.end) for s in spans] == [(0, 5), (9, 12)]


def test_zero_length_offsets_are_skipped_and_do_not_break_a_span():
    offs = [(0, 5), (5, 5), (6, 8)]
    spans = merge_tokens(TEXT, offs, [0.9, 0.0, 0.9], 0.5)
    assert [(s.start, s.end, len(s.probs)) for s in spans] == [(0, 8, 2)]


def test_punctuation_gap_is_not_whitespace_so_spans_stay_apart():
    text = "a,b"
    spans = merge_tokens(text, [(0, 1), (2, 3)], [0.9, 0.9], 0.5)
    assert len(spans) == 2


def test_filters_min_tokens_chars_confidence_and_trim_leading_space():
    text = " Lyon x"
    raw = [RawSpan(0, 5, (0.6, 0.7)), RawSpan(6, 7, (0.9,))]
    assert [(s.start, s.end) for s in filter_spans(text, raw, SpanFilter(0.5, 1, 2, 0.5))] == [(1, 5)]
    assert filter_spans(text, raw, SpanFilter(0.5, 3, 0, 0.0)) == []
    assert len(filter_spans(text, raw, SpanFilter(0.5, 1, 1, 0.0))) == 2
    assert filter_spans(text, raw, SpanFilter(0.5, 1, 0, 0.95)) == []


def test_response_score_noisy_or_and_max_span():
    raw = [RawSpan(0, 4, (0.5, 0.6)), RawSpan(10, 12, (0.7,))]
    assert response_score(raw, "noisy_or") == pytest.approx(1 - 0.5 * 0.4 * 0.3)
    assert response_score(raw, "max_span") == pytest.approx(0.7)
    assert response_score([], "noisy_or") == 0.0
    with pytest.raises(ValueError, match="score_method"):
        response_score(raw, "mean")


def test_sentence_holding_a_span():
    bounds = sentence_bounds(TEXT)
    assert [TEXT[s:e] for s, e in bounds] == ["Paris is big.", "Lyon has 9 million people."]
    assert sentence_for(TEXT, bounds, 14, 18) == "Lyon has 9 million people."
    assert sentence_for(TEXT, bounds, 9, 18) == TEXT  # crosses a boundary: both sentences
    assert math.isclose(len(sentence_bounds("one\ntwo")), 2)


def test_spans_snap_to_whole_words():
    text = "The tower is 1,280 metres tall in Oslonia."
    # WordPiece-style pieces: "Os" flagged, "lon" not, "ia" flagged -> one span, the whole word
    raw = [RawSpan(34, 36, (0.9,)), RawSpan(39, 41, (0.8,))]
    (span,) = filter_spans(text, raw, SpanFilter(0.5, 1, 2, 0.5))
    assert text[span.start:span.end] == "Oslonia" and span.probs == (0.9, 0.8)
    # a span cut inside a number and a word grows to both edges, punctuation outside stays out
    (span,) = filter_spans(text, [RawSpan(15, 21, (0.9,))], SpanFilter(0.5, 1, 2, 0.5))
    assert text[span.start:span.end] == "280 metres"
    assert snap_to_words(text, 13, 14) == (13, 14)  # "1" is a whole word before the comma
    assert snap_to_words(text, 24, 26) == (19, 25)  # "s ": the space is dropped, the word grows to "metres"
