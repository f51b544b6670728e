import pytest

from extproc.evaluation.suite import Gold, Scored, best_f1_threshold, choose_threshold, row_metrics, spans_at, stable_sample, suite_split


def test_split_is_by_group_and_stable():
    groups = [f"doc-{i}" for i in range(400)]
    splits = [suite_split(g) for g in groups]
    assert splits == [suite_split(g) for g in groups]  # deterministic
    assert 0.4 < splits.count("dev") / len(splits) < 0.6


def test_stable_sample_is_a_prefix_whatever_the_input_order():
    recs = [{"id": f"r{i}"} for i in range(50)]
    assert stable_sample(recs, 10) == stable_sample(list(reversed(recs)), 10)
    assert stable_sample(recs, 20)[:10] == stable_sample(recs, 10)


def test_best_f1_threshold_does_not_split_ties():
    # scores: 0.9 (pos), 0.8 (neg), 0.8 (pos), 0.1 (neg): cutting at 0.9 gives F1 2/3, at 0.8 gives 0.8
    assert best_f1_threshold([0.9, 0.8, 0.8, 0.1], [True, False, True, False]) == 0.8
    assert best_f1_threshold([0.5, 0.4], [False, False]) == float("inf")


def test_faithful_flagged_cap_keeps_the_threshold_above_flag_all():
    scores = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]
    gold = [True, False, True, False, True, False, True, False]
    assert best_f1_threshold(scores, gold) == 0.3  # uncapped: flag almost all (F1 0.8)
    assert best_f1_threshold(scores, gold, max_faithful_flagged=0.25) == 0.7  # 1 of 4 faithful flagged, F1 4/7
    assert best_f1_threshold(scores, gold, max_faithful_flagged=0.2) == 0.9  # none flagged


def test_spans_at_joins_snaps_and_falls_back_to_the_whole_answer():
    answer = "Paris is in Norway since 1999."
    tokens = Scored(0.9, ((0, 5, 0.1), (12, 15, 0.9), (15, 18, 0.8), (25, 29, 0.7)))
    assert spans_at(tokens, answer, 0.75) == [(12, 18)]  # "Norway": two pieces of one word join
    assert spans_at(tokens, answer, 0.5) == [(12, 18), (25, 29)]
    assert spans_at(tokens, answer, 0.95) == []  # not flagged
    assert spans_at(Scored(0.9), answer, 0.5) == [(0, len(answer))]


def test_row_metrics_counts_faithful_flagged_and_span_overlap():
    gold = [Gold("aaaa bbbb", ((5, 9),)), Gold("cccc", ()), Gold("dddd", ()), Gold("eeee", ((0, 4),))]
    scored = [Scored(0.9, ((0, 4, 0.1), (5, 9, 0.9))), Scored(0.8), Scored(0.1), Scored(0.2)]
    m = row_metrics(scored, gold, 0.5)
    assert (m["precision"], m["recall"], m["faithful_flagged"]) == (0.5, 0.5, 0.5)
    # predicted chars: 4 ("bbbb") + 4 (whole "cccc"); gold: 4 + 4; overlap 4 -> F1 0.5
    assert m["span_f1"] == pytest.approx(0.5)
    assert m["auroc"] == pytest.approx(0.75)


def test_threshold_is_chosen_on_the_selection_sets_only():
    scored = {"a": [Scored(0.9), Scored(0.2)], "b": [Scored(0.1), Scored(0.95)]}
    gold = {"a": [Gold("x", ((0, 1),)), Gold("x", ())], "b": [Gold("x", ((0, 1),)), Gold("x", ())]}
    assert choose_threshold(scored, gold, ["a"]) == 0.9  # set b would pull it to 0.1
