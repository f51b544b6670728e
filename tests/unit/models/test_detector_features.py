"""Detector training rows use the serving windowing; dev metrics (through extproc.evaluation.metrics) are computed correctly."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from extproc.inference.windowing import PairInput, Row  # noqa: E402
from models.pipelines.detector.evaluate import aggregate, metrics_at, predicted_spans  # noqa: E402
from models.pipelines.detector.features import Featurizer, token_labels, training_example  # noqa: E402
from models.shared import base_model_dir  # noqa: E402


@pytest.fixture(scope="module")
def feat() -> Featurizer:
    return Featurizer.from_file(str(base_model_dir() / "tokenizer.json"), overlap=16)


def _rec(context, answer, spans, question="Where is the office?"):
    return {"id": "r", "context": context, "question": question, "answer": answer,
            "labels": [{"start": s, "end": e} for s, e in spans], "source": "t"}


def test_token_labels_mark_overlapping_tokens_and_ignore_empty():
    offsets = [(0, 3), (4, 9), (9, 10), (0, 0)]
    assert token_labels(offsets, [{"start": 5, "end": 7}]) == [0, 1, 0, -100]


def test_training_example_labels_only_answer_tokens(feat: Featurizer):
    answer = "The head office is in Delhi. It also owns a bank in Paris."
    span = (answer.index("It also"), len(answer))
    ex = training_example(feat, _rec("The Oberoi Group has its head office in Delhi.", answer, [span]), 128)
    labelled = [i for i, y in enumerate(ex.label) if y != -100]
    # every labelled token is in the second segment (token type 1) and the specials are ignored
    assert all(ex.token_type_ids[i] == 1 for i in labelled)
    flagged = feat.tokenizer.decode([ex.input_ids[i] for i, y in enumerate(ex.label) if y == 1])
    assert flagged == "it also owns a bank in paris."
    assert ex.label[0] == -100 and ex.label[-1] == -100


def test_long_context_is_windowed_and_the_evidence_window_is_kept(feat: Featurizer):
    filler = " ".join(f"Unrelated sentence number {i} about weather." for i in range(60))
    context = filler + " The Zanzibar office was opened by Quentin Blake."
    answer = "Quentin Blake opened the Zanzibar office."
    ex = training_example(feat, _rec(context, answer, []), 96)
    assert ex.meta["windows"] > 1 and len(ex.input_ids) <= 96
    assert "zanzibar office was opened" in feat.tokenizer.decode(ex.input_ids)


def test_aggregate_max_and_min_over_windows():
    rows = (Row((0,) * 6, (0,) * 6, second_start=3, second_first=0, second_count=2),
            Row((0,) * 6, (0,) * 6, second_start=3, second_first=0, second_count=2))
    pin = PairInput(rows, ((0, 1), (2, 3)), 2)
    probs = [np.array([0, 0, 0, 0.9, 0.1, 0]), np.array([0, 0, 0, 0.2, 0.7, 0])]
    assert aggregate(pin, probs, "max").tolist() == pytest.approx([0.9, 0.7])
    assert aggregate(pin, probs, "min").tolist() == pytest.approx([0.2, 0.1])


def test_predicted_spans_join_adjacent_tokens():
    offsets = [(0, 3), (4, 8), (8, 9), (10, 14)]
    assert predicted_spans(offsets, np.array([0.9, 0.8, 0.7, 0.1]), 0.5) == [(0, 9)]
    assert predicted_spans(offsets, np.array([0.9, 0.1, 0.1, 0.9]), 0.5) == [(0, 3), (10, 14)]


def test_metrics_at_counts_examples_and_characters():
    items = [
        {"answer_len": 10, "gold": [(0, 4)], "offsets": [(0, 4), (5, 10)], "probs": np.array([0.9, 0.1])},
        {"answer_len": 10, "gold": [], "offsets": [(0, 4), (5, 10)], "probs": np.array([0.1, 0.6])},
        {"answer_len": 10, "gold": [(5, 10)], "offsets": [(0, 4), (5, 10)], "probs": np.array([0.1, 0.2])},
    ]
    m = metrics_at(items, 0.5)
    ex = m["example_level"]
    assert (ex["tp"], ex["fp"], ex["fn"], ex["tn"]) == (1, 1, 1, 0)
    assert ex["f1"] == pytest.approx(0.5)
    # predicted chars 4 + 5, gold chars 4 + 5, overlap 4
    assert m["span_level_char"]["precision"] == pytest.approx(4 / 9, abs=1e-4)
    assert m["span_level_char"]["recall"] == pytest.approx(4 / 9, abs=1e-4)
    assert m["auroc"] == pytest.approx(0.5)
