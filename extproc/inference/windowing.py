"""Context windows that always keep the answer in view.

A detector row is `[specials] prefix + context[a:b] + suffix [specials] answer[c:d] [specials]`.
Only context tokens are ever dropped from a row: the context is cut into
overlapping windows and every window is paired with the whole answer (or,
when the answer alone is too long, with overlapping answer chunks). Callers
combine rows per answer token with `aggregate_windows`. Truncating
`context + answer` at max length instead silently reports "clean" for long contexts.

Special tokens come from the tokenizer's own post-processor (probed once), so
BERT ([CLS] a [SEP] b [SEP], token types 0/1), ModernBERT (no token types) and
RoBERTa-style (<s> a </s></s> b </s>) layouts all work unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from tokenizers import Tokenizer

from extproc.inference.templates import render_detector_first, render_prompt


@dataclass(frozen=True, slots=True)
class PairLayout:
    """Special tokens and type ids the tokenizer puts around one or two segments."""

    pair_ids: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]  # before A, between, after B
    pair_types: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
    single_ids: tuple[tuple[int, ...], tuple[int, ...]]  # before, after
    single_types: tuple[tuple[int, ...], tuple[int, ...]]
    type_a: int
    type_b: int

    @property
    def pair_specials(self) -> int:
        return sum(len(x) for x in self.pair_ids)

    @property
    def single_specials(self) -> int:
        return sum(len(x) for x in self.single_ids)


@dataclass(frozen=True, slots=True)
class Row:
    """One model input row; `second_pos` maps row positions to second-segment token indices."""

    input_ids: tuple[int, ...]
    type_ids: tuple[int, ...]
    second_start: int = 0  # row index of the first second-segment token
    second_first: int = 0  # which second-segment token sits there
    second_count: int = 0

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass(frozen=True, slots=True)
class PairInput:
    """All rows for one (first, second) example plus the second segment's offsets."""

    rows: tuple[Row, ...]
    second_offsets: tuple[tuple[int, int], ...]  # character offsets into the second text
    second_len: int  # number of second-segment tokens


def prepare_tokenizer(tokenizer: Tokenizer) -> Tokenizer:
    """Windowing is ours: the tokenizer must neither truncate nor pad."""
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def _split(enc, n_groups: int) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]], dict[int, int]]:
    ids, types, seq = enc.ids, enc.type_ids, enc.sequence_ids
    groups_ids: list[list[int]] = [[] for _ in range(n_groups)]
    groups_types: list[list[int]] = [[] for _ in range(n_groups)]
    seg_type: dict[int, int] = {}
    group = 0
    for tid, ttype, s in zip(ids, types, seq):
        if s is None:
            groups_ids[group].append(tid)
            groups_types[group].append(ttype)
        else:
            seg_type.setdefault(s, ttype)
            group = s + 1
    return [tuple(g) for g in groups_ids], [tuple(g) for g in groups_types], seg_type


def probe_layout(tokenizer: Tokenizer) -> PairLayout:
    """Ask the tokenizer where it puts special tokens (done once per model)."""
    pair = tokenizer.encode("a", "b", add_special_tokens=True)
    p_ids, p_types, seg = _split(pair, 3)
    single = tokenizer.encode("a", add_special_tokens=True)
    s_ids, s_types, _ = _split(single, 2)
    return PairLayout(
        pair_ids=(p_ids[0], p_ids[1], p_ids[2]),
        pair_types=(p_types[0], p_types[1], p_types[2]),
        single_ids=(s_ids[0], s_ids[1]),
        single_types=(s_types[0], s_types[1]),
        type_a=seg.get(0, 0),
        type_b=seg.get(1, 0),
    )


def _spans(total: int, size: int, overlap: int) -> list[tuple[int, int]]:
    """Overlapping [start, end) ranges covering `total` items, each at most `size` long."""
    if total <= size:
        return [(0, total)]
    step = max(1, size - overlap)
    out, start = [], 0
    while True:
        end = min(start + size, total)
        out.append((start, end))
        if end >= total:
            return out
        start += step


def _pair_row(
    layout: PairLayout, first: Sequence[int], second: Sequence[int], second_first: int
) -> Row:
    pre, mid, post = layout.pair_ids
    tpre, tmid, tpost = layout.pair_types
    ids = (*pre, *first, *mid, *second, *post)
    types = (*tpre, *([layout.type_a] * len(first)), *tmid, *([layout.type_b] * len(second)), *tpost)
    return Row(ids, types, len(pre) + len(first) + len(mid), second_first, len(second))


def window_pair(
    layout: PairLayout,
    prefix: Sequence[int],
    context: Sequence[int],
    suffix: Sequence[int],
    second: Sequence[int],
    max_length: int,
    overlap: int,
    chunk_second: bool = True,
) -> list[Row]:
    """Rows pairing context windows (with fixed prefix/suffix) with the second segment.

    The fixed part (template text, question) is in every row; callers bound it
    (see `detector_input`). The second segment is kept whole while a
    quarter-row context window still fits next to it, else chunked into
    half-row pieces (chunk_second) or truncated.
    """
    budget = max_length - layout.pair_specials
    room = budget - len(prefix) - len(suffix)
    if room < 8:
        raise ValueError(
            f"template text and question take {len(prefix) + len(suffix)} of {max_length} tokens: "
            "no room for context and answer (raise max_length or shorten the template)"
        )
    if len(second) <= room - min(len(context), room // 4):
        chunks = [(0, len(second))]
    elif chunk_second:  # long answer: half the row for an answer chunk, half for context
        cap = room // 2 if context else room
        chunks = _spans(len(second), cap, min(overlap, cap // 4))
    else:
        chunks = [(0, room // 2 if context else room)]
    rows: list[Row] = []
    for c0, c1 in chunks:
        ctx_budget = room - (c1 - c0)
        windows = _spans(len(context), ctx_budget, min(overlap, ctx_budget // 2)) if context else [(0, 0)]
        for w0, w1 in windows:
            first = (*prefix, *context[w0:w1], *suffix)
            rows.append(_pair_row(layout, first, second[c0:c1], c0))
    return rows


def aggregate_windows(prepared: PairInput, row_scores: Sequence[np.ndarray]) -> np.ndarray:
    """Per answer token P(unsupported) from every row's scores (one value per row position).

    Evidence-aware: a token is supported when *any* context window supports it, so
    rows that pair the same answer chunk with different context windows take the
    min (a window that lacks the evidence must not flag what another window
    supports; a contradiction is still flagged, since the windows without the
    evidence do not support the claim either). Overlapping answer chunks, which
    judge a token in two contexts of answer text, take the max.
    """
    by_chunk: dict[tuple[int, int], np.ndarray] = {}
    for row, scores in zip(prepared.rows, row_scores):
        seg = np.asarray(scores[row.second_start : row.second_start + row.second_count], dtype=np.float32)
        key = (row.second_first, row.second_count)
        seen = by_chunk.get(key)
        by_chunk[key] = seg.copy() if seen is None else np.minimum(seen, seg)
    out = np.zeros(prepared.second_len, dtype=np.float32)
    for (first, count), seg in by_chunk.items():
        window = out[first : first + count]
        np.maximum(window, seg, out=window)
    return out


def best_windows(prepared: PairInput, per_chunk: int) -> PairInput:
    """Per answer chunk, only the `per_chunk` rows whose context shares the most token ids with that chunk
    (ties: the earlier window), in their order: a bounded read of a context too long for the request budget.
    The windows most likely to hold the evidence stay, so the evidence-aware min keeps its support."""
    by_chunk: dict[tuple[int, int], list[int]] = {}
    for i, row in enumerate(prepared.rows):
        by_chunk.setdefault((row.second_first, row.second_count), []).append(i)
    keep: set[int] = set()
    for idx in by_chunk.values():
        first = prepared.rows[idx[0]]
        words = set(first.input_ids[first.second_start : first.second_start + first.second_count])
        keep.update(idx[k] for k in _most_shared([prepared.rows[i] for i in idx], words, max(per_chunk, 1)))
    return PairInput(tuple(r for i, r in enumerate(prepared.rows) if i in keep), prepared.second_offsets,
                     prepared.second_len)


def _most_shared(rows: Sequence[Row], words: set[int], k: int) -> list[int]:
    """Indices of the `k` rows whose first segment shares the most token ids with `words` (ties: the earlier
    row), in row order: the windows most likely to hold the evidence for that text."""
    ranked = sorted(range(len(rows)), key=lambda i: (-len(words.intersection(rows[i].input_ids[: rows[i].second_start])), i))
    return sorted(ranked[:k])


def _classify_first(enc, start: int, end: int) -> tuple[list[int], list[int], list[int]]:
    """Split first-segment tokens into prefix / context / suffix by character offsets."""
    prefix, context, suffix = [], [], []
    for tid, (s, e) in zip(enc.ids, enc.offsets):
        if start < end and s < end and (e > start or (s == e and s >= start)):
            context.append(tid)
        elif s < start:
            prefix.append(tid)
        else:
            suffix.append(tid)
    return prefix, context, suffix


def detector_input(
    tokenizer: Tokenizer,
    layout: PairLayout,
    template: Mapping[str, str],
    context: Sequence[str],
    question: str | None,
    answer: str,
    max_length: int,
    overlap: int,
) -> PairInput:
    """Rows for the token classifier; answer token offsets are into `answer`.

    A question longer than a quarter of the row is cut (keeping its start) so
    it cannot crowd out the context and answer in every window.
    """
    if question:
        q_offsets = tokenizer.encode(question, add_special_tokens=False).offsets
        cap = max(1, (max_length - layout.pair_specials) // 4)
        if len(q_offsets) > cap:
            question = question[: q_offsets[cap - 1][1]]
    rendered = render_detector_first(template, context, question)
    first_enc, ans_enc = tokenizer.encode_batch([rendered.text, answer], add_special_tokens=False)
    prefix, ctx, suffix = _classify_first(first_enc, rendered.context_start, rendered.context_end)
    rows = window_pair(layout, prefix, ctx, suffix, ans_enc.ids, max_length, overlap)
    return PairInput(tuple(rows), tuple(ans_enc.offsets), len(ans_enc.ids))


def template_overhead(tokenizer: Tokenizer, layout: PairLayout, template: Mapping[str, str]) -> int:
    """Tokens a detector template costs in every row (no context, no question, specials included)."""
    rendered = render_detector_first(template, [], None)
    return len(tokenizer.encode(rendered.text, add_special_tokens=False).ids) + layout.pair_specials


def nli_inputs(
    tokenizer: Tokenizer,
    layout: PairLayout,
    premise: str,
    hypotheses: Sequence[str],
    max_length: int,
    overlap: int,
    max_windows: int = 0,
) -> list[PairInput]:
    """Rows for (premise, hypothesis) pairs: the premise is windowed, the hypothesis kept whole.

    `max_windows` > 0 keeps, per hypothesis, only the premise windows sharing the most token ids
    with it (ties: the earlier window), so verifying a sentence against a context of thousands of
    tokens costs a bounded number of rows instead of one per window.
    """
    encs = tokenizer.encode_batch([premise, *hypotheses], add_special_tokens=False)
    premise_ids = encs[0].ids
    out = []
    for enc in encs[1:]:
        rows = window_pair(layout, (), premise_ids, (), enc.ids, max_length, overlap, chunk_second=False)
        if 0 < max_windows < len(rows):
            rows = [rows[i] for i in _most_shared(rows, set(enc.ids), max_windows)]
        out.append(PairInput(tuple(rows), tuple(enc.offsets), len(enc.ids)))
    return out


def single_row(layout: PairLayout, ids: Sequence[int], max_length: int) -> Row:
    """One-segment row; an over-long text keeps its head and tail (the question is usually last)."""
    budget = max_length - layout.single_specials
    if len(ids) > budget:
        head = budget // 2
        ids = (*ids[:head], *ids[len(ids) - (budget - head):])
    pre, post = layout.single_ids
    tpre, tpost = layout.single_types
    return Row((*pre, *ids, *post), (*tpre, *([layout.type_a] * len(ids)), *tpost))


def prompt_rows(
    tokenizer: Tokenizer, layout: PairLayout, template: Mapping[str, str], prompts: Sequence[str], max_length: int
) -> list[Row]:
    """Sentinel rows, one per prompt."""
    encs = tokenizer.encode_batch([render_prompt(template, p) for p in prompts], add_special_tokens=False)
    return [single_row(layout, e.ids, max_length) for e in encs]
