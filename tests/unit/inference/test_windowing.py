from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from extproc.inference.manifest import DEFAULT_TEMPLATES
from extproc.inference.templates import LETTUCEDETECT_TEMPLATE, render_detector_first
from extproc.inference.windowing import (
    PairInput,
    Row,
    aggregate_windows,
    best_windows,
    detector_input,
    prepare_tokenizer,
    probe_layout,
    prompt_rows,
    single_row,
    window_pair,
)

PREFIX, SUFFIX = (901, 902), (903,)
CONTEXT = tuple(range(1000, 1300))
ANSWER = tuple(range(2000, 2012))


@pytest.fixture(scope="module")
def bert_tok(tiny_models) -> Tokenizer:
    return prepare_tokenizer(Tokenizer.from_file(str(Path(tiny_models["bert-token"]) / "tokenizer.json")))


@pytest.fixture(scope="module")
def modern_tok(tiny_models) -> Tokenizer:
    return prepare_tokenizer(Tokenizer.from_file(str(Path(tiny_models["modernbert-token"]) / "tokenizer.json")))


def _second(row):
    return row.input_ids[row.second_start : row.second_start + row.second_count]


def test_layouts_come_from_the_tokenizer(bert_tok, modern_tok):
    bert, modern = probe_layout(bert_tok), probe_layout(modern_tok)
    cls, sep = bert_tok.token_to_id("[CLS]"), bert_tok.token_to_id("[SEP]")
    assert bert.pair_ids == ((cls,), (sep,), (sep,)) and (bert.type_a, bert.type_b) == (0, 1)
    assert modern.pair_specials == 3 and modern.type_a == modern.type_b == 0


def test_long_context_is_windowed_and_every_row_holds_the_whole_answer(bert_tok):
    layout = probe_layout(bert_tok)
    rows = window_pair(layout, PREFIX, CONTEXT, SUFFIX, ANSWER, max_length=128, overlap=16)
    assert len(rows) > 1
    seen = set()
    for row in rows:
        assert len(row) <= 128
        assert _second(row) == ANSWER and row.second_first == 0
        assert row.input_ids[1:3] == PREFIX and SUFFIX[0] in row.input_ids
        seen.update(t for t in row.input_ids if 1000 <= t < 1300)
        types = row.type_ids[row.second_start : row.second_start + row.second_count]
        assert set(types) == {1}
    assert seen == set(CONTEXT)  # nothing of the context is lost


def test_neighbouring_windows_overlap(bert_tok):
    rows = window_pair(probe_layout(bert_tok), (), CONTEXT, (), ANSWER, max_length=128, overlap=16)
    ctx = [[t for t in r.input_ids if 1000 <= t < 1300] for r in rows]
    for a, b in zip(ctx, ctx[1:]):
        assert len(set(a) & set(b)) == 16


def test_long_answer_is_chunked_and_every_answer_token_is_scored(bert_tok):
    answer = tuple(range(5000, 5400))
    rows = window_pair(probe_layout(bert_tok), PREFIX, CONTEXT, SUFFIX, answer, max_length=128, overlap=16)
    covered = set()
    for row in rows:
        assert len(row) <= 128
        seg = _second(row)
        assert seg == answer[row.second_first : row.second_first + row.second_count]
        covered.update(seg)
    assert covered == set(answer)


def test_no_context_still_gives_one_row_per_answer_chunk(bert_tok):
    rows = window_pair(probe_layout(bert_tok), (), (), (), ANSWER, max_length=128, overlap=16)
    assert len(rows) == 1 and _second(rows[0]) == ANSWER


def test_nli_style_second_segment_is_truncated_not_chunked(bert_tok):
    hyp = tuple(range(5000, 5400))
    rows = window_pair(probe_layout(bert_tok), (), CONTEXT, (), hyp, 128, 16, chunk_second=False)
    assert all(r.second_first == 0 and len(r) <= 128 for r in rows)


def test_detector_input_offsets_point_into_the_answer(bert_tok):
    layout = probe_layout(bert_tok)
    answer = "The capital of France is Lyon."
    context = ["Paris is the capital of France. " * 30, "The Eiffel tower was built in 1889."]
    pi = detector_input(bert_tok, layout, DEFAULT_TEMPLATES["token-classification"], context, "What is the capital?", answer, 128, 16)
    assert len(pi.rows) > 1
    words = [answer[s:e].lower() for s, e in pi.second_offsets]
    assert words[:3] == ["the", "capital", "of"] and words[-1] == "."
    for row in pi.rows:
        text = bert_tok.decode(list(row.input_ids))
        assert "question : what is the capital?" in text  # the question survives windowing
        assert text.endswith("the capital of france is lyon.")
    assert any("1889" in bert_tok.decode(list(r.input_ids)) for r in pi.rows)  # last passage reached


def test_lettucedetect_template_numbers_passages():
    rendered = render_detector_first(LETTUCEDETECT_TEMPLATE, ["A is B.", "C is D."], "What is A?")
    assert "What is A?\nBear in mind" in rendered.text
    assert "following 2 passages:\npassage 1: A is B.\npassage 2: C is D.\n" in rendered.text
    assert rendered.text[rendered.context_start : rendered.context_end] == "passage 1: A is B.\npassage 2: C is D."
    assert rendered.text.endswith("given passages.\"\noutput:")


def test_user_braces_are_inserted_verbatim():
    rendered = render_detector_first(DEFAULT_TEMPLATES["token-classification"], ["x = {question}"], "{context}?")
    assert rendered.text == "x = {question}\n\nQuestion: {context}?"


def test_sentinel_rows_keep_head_and_tail_of_long_prompts(bert_tok):
    layout = probe_layout(bert_tok)
    row = single_row(layout, tuple(range(3000, 3500)), 64)
    assert len(row) == 64 and row.input_ids[1] == 3000 and row.input_ids[-2] == 3499
    (short,) = prompt_rows(bert_tok, layout, {"first": "{prompt}"}, ["what is the dose?"], 64)
    assert bert_tok.decode(list(short.input_ids)) == "what is the dose?"


def test_overlong_question_is_cut_so_context_and_answer_keep_their_room(bert_tok):
    layout = probe_layout(bert_tok)
    question = "what is the capital of france " * 40
    pi = detector_input(bert_tok, layout, DEFAULT_TEMPLATES["token-classification"], ["paris is the capital."],
                        question, "lyon is the capital.", 128, 16)
    (row,) = pi.rows
    text = bert_tok.decode(list(row.input_ids))
    assert "paris is the capital." in text and text.endswith("lyon is the capital.")
    assert text.count("what is the capital of france") < 40


def _evidence_scores(rows, supported_by):
    """A stand-in detector: an answer token is supported (0.05) in a row whose context holds
    its evidence token, unsupported (0.95) elsewhere; `supported_by` maps answer id -> evidence id."""
    out = []
    for row in rows:
        ctx = set(row.input_ids[: row.second_start])
        scores = np.full(len(row), 0.95, np.float32)
        for k, tid in enumerate(_second(row)):
            if supported_by.get(tid) in ctx:
                scores[row.second_start + k] = 0.05
        out.append(scores)
    return out


def test_answer_supported_by_one_of_three_windows_is_not_flagged(bert_tok):
    rows = window_pair(probe_layout(bert_tok), PREFIX, CONTEXT, SUFFIX, ANSWER, max_length=128, overlap=16)
    assert len(rows) >= 3
    first_only = [t for t in CONTEXT if t in rows[0].input_ids and all(t not in r.input_ids for r in rows[1:])]
    evidence = {a: first_only[i] for i, a in enumerate(ANSWER)}  # every answer token's evidence sits in window 1
    probs = aggregate_windows(PairInput(tuple(rows), (), len(ANSWER)), _evidence_scores(rows, evidence))
    assert probs.max() < 0.5  # the max over windows (the old rule) flagged every token


def test_claim_no_window_supports_is_still_flagged(bert_tok):
    rows = window_pair(probe_layout(bert_tok), PREFIX, CONTEXT, SUFFIX, ANSWER, max_length=128, overlap=16)
    evidence = {a: CONTEXT[0] for a in ANSWER[:6]}  # the rest (a contradiction, say) has support nowhere
    probs = aggregate_windows(PairInput(tuple(rows), (), len(ANSWER)), _evidence_scores(rows, evidence))
    assert probs[:6].max() < 0.5 and probs[6:].min() > 0.5


def test_overlapping_answer_chunks_take_the_max():
    from extproc.inference.windowing import Row

    rows = (Row((0,) * 6, (0,) * 6, 2, 0, 3), Row((0,) * 6, (0,) * 6, 2, 1, 3))  # answer tokens 0-2 and 1-3
    p0 = np.array([0, 0, 0.2, 0.9, 0.1, 0], np.float32)
    p1 = np.array([0, 0, 0.5, 0.3, 0.8, 0], np.float32)
    probs = aggregate_windows(PairInput(rows, (), 4), [p0, p1])
    assert probs.tolist() == pytest.approx([0.2, 0.9, 0.3, 0.8])


def test_context_windows_of_one_answer_chunk_take_the_min():
    from extproc.inference.windowing import Row

    rows = (Row((0,) * 6, (0,) * 6, 2, 0, 3), Row((0,) * 6, (0,) * 6, 2, 0, 3))  # same answer chunk, two contexts
    p0 = np.array([0, 0, 0.2, 0.9, 0.7, 0], np.float32)
    p1 = np.array([0, 0, 0.5, 0.3, 0.8, 0], np.float32)
    assert aggregate_windows(PairInput(rows, (), 3), [p0, p1]).tolist() == pytest.approx([0.2, 0.3, 0.7])


def test_nli_keeps_the_windows_sharing_most_tokens_with_the_hypothesis(bert_tok):
    from extproc.inference.windowing import nli_inputs

    layout = probe_layout(bert_tok)
    filler = " ".join(["river bank water"] * 200)
    premise = f"{filler} The observatory was founded in 1675 by royal warrant. {filler}"
    hypothesis = "The observatory was founded in 1675."
    (every,) = nli_inputs(bert_tok, layout, premise, [hypothesis], max_length=64, overlap=8)
    (best,) = nli_inputs(bert_tok, layout, premise, [hypothesis], max_length=64, overlap=8, max_windows=2)
    assert len(every.rows) > 10 and len(best.rows) == 2
    words = set(bert_tok.encode(hypothesis, add_special_tokens=False).ids)
    shared = [len(words.intersection(r.input_ids[: r.second_start])) for r in every.rows]
    assert max(shared) > sorted(shared)[-3]  # one window holds the evidence sentence
    assert max(len(words.intersection(r.input_ids[: r.second_start])) for r in best.rows) == max(shared)  # kept
    order = [every.rows.index(r) for r in best.rows]
    assert order == sorted(order)  # kept in premise order


def test_best_windows_keeps_per_answer_chunk_the_windows_sharing_most_tokens() -> None:
    def row(context: tuple[int, ...], answer: tuple[int, ...], first: int) -> Row:
        return Row((*context, *answer), (0,) * (len(context) + len(answer)), len(context), first, len(answer))

    rows = (row((1, 2, 3), (7, 8), 0), row((7, 9, 9), (7, 8), 0), row((7, 8, 1), (7, 8), 0),  # chunk 1: 0, 1, 2 shared
            row((4, 4, 4), (5, 6), 2), row((5, 4, 4), (5, 6), 2))  # chunk 2: 0, 1 shared
    prepared = PairInput(rows, ((0, 1), (1, 2), (2, 3), (3, 4)), 4)
    kept = best_windows(prepared, 1)
    assert kept.rows == (rows[2], rows[4]) and kept.second_len == 4 and kept.second_offsets == prepared.second_offsets
    assert best_windows(prepared, 2).rows == (rows[1], rows[2], rows[3], rows[4])  # order kept, ties: the earlier
    assert best_windows(prepared, 5).rows == rows
