"""Metric definitions on cases small enough to compute by hand."""

from __future__ import annotations

import numpy as np
import pytest

from extproc.evaluation.metrics import (
    CharOverlap,
    Confusion,
    auroc,
    covered_chars,
    latency_summary,
    merge_intervals,
    overlap_chars,
    token_confusion,
)


def test_merge_intervals_sorts_merges_overlaps_and_drops_empty() -> None:
    assert merge_intervals([(5, 10), (0, 3), (2, 4), (9, 12), (7, 7)]) == [(0, 4), (5, 12)]
    assert covered_chars([(0, 10), (5, 15)]) == 15


def test_overlap_partial_and_disjoint() -> None:
    assert overlap_chars([(0, 10)], [(5, 15)]) == 5
    assert overlap_chars([(0, 5)], [(5, 10)]) == 0  # half-open: touching is not overlapping
    # overlapping predictions count once
    assert overlap_chars([(0, 6), (4, 10)], [(2, 8), (20, 30)]) == 6


def test_char_overlap_perfect() -> None:
    acc = CharOverlap()
    acc.add([(3, 9)], [(3, 9)])
    m = acc.prf()
    assert (m["precision"], m["recall"], m["f1"]) == (1.0, 1.0, 1.0)


def test_char_overlap_pooled_over_examples_not_averaged() -> None:
    acc = CharOverlap()
    acc.add([(0, 10)], [(5, 15)])  # overlap 5, pred 10, gold 10
    acc.add([(0, 2)], [(0, 30)])  # overlap 2, pred 2, gold 30
    m = acc.prf()
    assert m["overlap_chars"] == 7 and m["predicted_chars"] == 12 and m["gold_chars"] == 40
    assert m["precision"] == pytest.approx(7 / 12)
    assert m["recall"] == pytest.approx(7 / 40)
    assert m["f1"] == pytest.approx(14 / 52)


def test_empty_predictions_and_gold_are_undefined_not_zero() -> None:
    acc = CharOverlap()
    acc.add([], [])
    m = acc.prf()
    assert m["precision"] is None and m["recall"] is None and m["f1"] is None
    c = Confusion()
    c.add(False, False)
    assert c.prf()["precision"] is None and c.prf()["tn"] == 1


def test_missed_everything_is_zero_recall_undefined_precision() -> None:
    acc = CharOverlap()
    acc.add([], [(0, 4)])
    m = acc.prf()
    assert m["precision"] is None and m["recall"] == 0.0 and m["f1"] == 0.0


def test_confusion_prf() -> None:
    c = Confusion()
    for pred, gold in [(True, True), (True, True), (True, False), (False, True), (False, False)]:
        c.add(pred, gold)
    m = c.prf()
    assert (m["tp"], m["fp"], m["fn"], m["tn"]) == (2, 1, 1, 1)
    assert m["precision"] == pytest.approx(2 / 3) and m["recall"] == pytest.approx(2 / 3)
    assert m["f1"] == pytest.approx(2 / 3)


def test_token_confusion_uses_overlap_and_threshold_and_skips_empty_tokens() -> None:
    offsets = [(0, 3), (4, 7), (8, 8), (8, 12), (13, 15)]
    probs = [0.9, 0.2, 0.99, 0.6, 0.5]
    gold = [(5, 6), (14, 20)]
    c = token_confusion(offsets, probs, gold, threshold=0.5)
    # (0,3) fp; (4,7) fn; (8,8) skipped; (8,12) fp; (13,15) tp (p == threshold counts)
    assert (c.tp, c.fp, c.fn, c.tn) == (1, 2, 1, 0)


def test_token_confusion_length_mismatch_raises() -> None:
    with pytest.raises(ValueError):
        token_confusion([(0, 1)], [0.1, 0.2], [], 0.5)


def test_auroc_known_value() -> None:
    assert auroc([0.1, 0.4, 0.35, 0.8], [False, False, True, True]) == pytest.approx(0.75)


def test_auroc_perfect_inverted_and_ties() -> None:
    assert auroc([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1]) == 1.0
    assert auroc([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1]) == 0.0
    assert auroc([0.5, 0.5, 0.5], [0, 1, 1]) == 0.5
    # one tie across classes counts half: pairs (pos 0.5 vs neg 0.5)=0.5, (pos 0.9 vs neg 0.5)=1
    assert auroc([0.5, 0.5, 0.9], [0, 1, 1]) == pytest.approx(0.75)


def test_auroc_single_class_is_undefined() -> None:
    assert auroc([0.1, 0.9], [False, False]) is None
    assert auroc([0.1, 0.9], [True, True]) is None
    assert auroc([], []) is None


def test_latency_summary() -> None:
    m = latency_summary([float(v) for v in range(1, 101)])
    assert m["p50"] == pytest.approx(50.5) and m["p95"] == pytest.approx(95.05)
    assert m["max"] == 100.0 and m["count"] == 100
    assert latency_summary([])["p50"] is None


def test_missing_scikit_learn_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse
    import sys

    from extproc.commands import eval as eval_cmd

    monkeypatch.setitem(sys.modules, "sklearn", None)  # import sklearn -> ImportError
    with pytest.raises(ImportError, match=r"truthlens\[eval\]"):
        auroc([0.1, 0.9], [False, True])
    monkeypatch.setattr("extproc.evaluation.metrics.missing_eval_packages", lambda: ["sklearn"])
    assert eval_cmd.run(argparse.Namespace(data="unused.jsonl")) == 1


def test_auroc_difference_matches_auroc_and_its_interval_brackets_it() -> None:
    from extproc.evaluation.metrics import auroc_difference_resamples, interval

    rng = np.random.default_rng(3)
    y = rng.random(200) < 0.4
    good = y + rng.normal(0, 0.8, 200)  # informative
    ties = np.round(rng.random(200), 1)  # uninformative, with many ties (mid-ranks, as scikit-learn counts them)
    diff, resampled = auroc_difference_resamples(good, ties, y, resamples=500)
    assert diff == pytest.approx(auroc(list(good), list(y)) - auroc(list(ties), list(y)))
    ci = interval(diff, resampled)
    assert 0 < ci["low"] < diff < ci["high"] and ci["share_le_0"] == 0.0
    same, same_resampled = auroc_difference_resamples(good, good, y, resamples=50)
    assert same == 0.0 and not same_resampled.any()
    assert auroc_difference_resamples([0.1, 0.2], [0.3, 0.4], [True, True]) is None  # one class: undefined


def test_auroc_difference_keeps_both_classes_in_every_draw() -> None:
    from extproc.evaluation.metrics import auroc_difference_resamples

    # one positive among 20: many plain draws would lack it; each is drawn again, so no NaN
    y = [True] + [False] * 19
    _, resampled = auroc_difference_resamples(list(range(20)), list(range(20))[::-1], y, resamples=300)
    assert resampled.shape == (300,) and bool(np.isfinite(resampled).all())


def test_flagged_at_recall_counts_negatives_at_the_catching_threshold() -> None:
    from extproc.evaluation.metrics import flagged_at_recall

    scores = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]
    labels = [True, False, True, False, True, False, False, True]
    # recall 0.5 of 4 positives = 2: threshold 0.7 flags 0.9, 0.8, 0.7 -> 1 of 4 negatives
    assert flagged_at_recall(scores, labels, 0.5) == 0.25
    assert flagged_at_recall(scores, labels, 0.6) == 0.5  # 3 positives: threshold 0.5 -> 0.8, 0.6 flagged
    assert flagged_at_recall(scores, labels, 1.0) == 1.0
    assert flagged_at_recall([0.3, 0.3, 0.3], [True, False, False], 0.6) == 1.0  # ties flag together
    assert flagged_at_recall([0.1], [True], 0.6) is None
